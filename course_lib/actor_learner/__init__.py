"""An actor-learner system of real processes: IMPALA and SEED RL layouts (lesson 03).

Modules, one concept each:

* :mod:`.envs`: gymnasium vector envs with same-step autoreset;
* :mod:`.model`: the actor-critic MLP every process shares;
* :mod:`.buffers`: shared-memory rollout slots and published weights (with a version);
* :mod:`.actor`: the IMPALA actor (policy copy, unrolls into a slot);
* :mod:`.seed`: SEED RL's env-only actors and central batched inference;
* :mod:`.learner`: the V-trace loss, policy-lag accounting, one update;
* :mod:`.timers`: named per-phase timers;
* :mod:`.system`: start, train, supervise (restart crashed actors) and stop.
"""
