"""PPO two ways (lesson 04).

- ``config``: PPO's hyperparameters, shared by both loops (no JAX, no torch)
- ``jax_ppo``: PureJaxRL-style PPO, the whole run one jitted program; sets the XLA CPU flag its
  programs need on import, before JAX starts a backend
- ``torch_ppo``: the classic PPO loop it is compared with; imports no JAX

This file imports nothing, so ``course_lib.ppo.torch_ppo`` never starts JAX.
"""
