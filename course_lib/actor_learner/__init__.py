"""An actor-learner system of real processes: IMPALA and SEED RL layouts (lesson 03).

Modules, one concept each:

* :mod:`.envs`: gymnasium vector envs with same-step autoreset;
* :mod:`.model`: the actor-critic MLP every process shares;
* :mod:`.buffers`: shared-memory rollout slots (the weights travel through
  :class:`course_lib.runtime.weights.SharedWeights`);
* :mod:`.actor`: the IMPALA actor (policy copy, unrolls into a slot);
* :mod:`.seed`: SEED RL's env-only actors and central batched inference;
* :mod:`.learner`: the V-trace loss, policy-lag accounting, one update;
* :mod:`.timers`: named per-phase timers;
* :mod:`.system`: start, train, supervise (restart crashed actors) and stop;
* :mod:`.heartbeats`: how the supervisor tells a frozen actor (lesson 10);
* :mod:`.faults`: the lag bound, a fault injector, faults vs none (lesson 10).

The package's public pieces, importable from here, are lesson 03's agent: the network
(:class:`ActorCritic`), its loss (:func:`loss_terms`, :class:`LossConfig`) and the
environments it trains on (:func:`make_envs`). The multi-process system uses them, and so
does the single-process controlled-lag ablation (:mod:`course_lib.pipeline.lag`), which imports
them from here and nothing else of the package. The system itself lives in
:mod:`.system` (not imported here).
"""

from course_lib.actor_learner.envs import make_envs
from course_lib.actor_learner.learner import LossConfig, LossTerms, loss_terms
from course_lib.actor_learner.model import ActorCritic

__all__ = ["ActorCritic", "LossConfig", "LossTerms", "loss_terms", "make_envs"]
