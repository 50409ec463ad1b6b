"""PPO's hyperparameters (lesson 04), shared by the JAX loop and the classic torch loop.

:class:`PPOConfig` is a plain frozen dataclass with no JAX or torch in it, so the classic
baseline (:mod:`course_lib.ppo.torch_ppo`) reads the same hyperparameters as the end-to-end
jitted loop (:mod:`course_lib.ppo.jax_ppo`, which re-exports it) without importing JAX.
``course_lib.describe(PPOConfig())`` lists every field with its help.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PPOConfig:
    """Every PPO hyperparameter (PureJaxRL's CartPole defaults). :func:`course_lib.describe` lists the help."""

    num_envs: int = field(default=4, metadata={"help": "parallel environments stepped together"})
    num_steps: int = field(default=128, metadata={"help": "steps per env per rollout (the update's time horizon T)"})
    total_timesteps: int = field(
        default=500_000, metadata={"help": "environment steps of the whole run, all envs together"}
    )
    update_epochs: int = field(default=4, metadata={"help": "passes over each rollout"})
    num_minibatches: int = field(
        default=4, metadata={"help": "minibatches per pass (each num_envs * num_steps / num_minibatches)"}
    )
    gamma: float = field(default=0.99, metadata={"help": "discount"})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda (04.3)"})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO ratio clip (04.4) and value clip (04.5)"})
    ent_coef: float = field(default=0.01, metadata={"help": "weight of the entropy bonus (04.6)"})
    vf_coef: float = field(default=0.5, metadata={"help": "weight of the value loss (04.6)"})
    max_grad_norm: float = field(default=0.5, metadata={"help": "clip the gradient's global L2 norm to this"})
    lr: float = field(default=2.5e-4, metadata={"help": "Adam learning rate (eps = 1e-5)"})
    anneal_lr: bool = field(default=True, metadata={"help": "decay the learning rate linearly to 0 over the run"})
    hidden: int = field(default=64, metadata={"help": "width of the two tanh hidden layers of actor and critic"})
    unroll: int = field(default=1, metadata={"help": "lax.scan unroll of the rollout (speed only; same numbers)"})

    @property
    def num_updates(self) -> int:
        """Rollout-and-learn iterations: ``total_timesteps // (num_envs * num_steps)``."""
        return self.total_timesteps // (self.num_envs * self.num_steps)

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def steps_per_run(self) -> int:
        """Environment steps one ``train`` call really takes (``num_updates * batch_size``)."""
        return self.num_updates * self.batch_size

    @property
    def grad_steps_per_update(self) -> int:
        """Minibatch gradient steps per update: ``update_epochs * num_minibatches``."""
        return self.update_epochs * self.num_minibatches
