"""Fault tolerance and checkpointing (lesson 10): lose nothing, resume bit-exact.

The package, a module per concept:

- ``atomic``: the commit protocol every checkpoint goes through: write into a private
  ``.tmp-*`` dir, fsync, a sha256 manifest, one ``os.replace``; verify, list, restore the
  newest complete checkpoint with fallback over corrupt ones, keep the last N.
- ``crash``: the kill harness: run a function in a child process and SIGKILL it (at a
  time, or at a named :class:`~course_lib.checkpoint.crash.KillPoint` inside the code).
- ``torch_state``: a torch training state (weights, optimizer state, RNG states, data
  position) in safetensors + JSON, committed through ``atomic``.
- ``reinforce_resume``: lesson 01's REINFORCE as a resumable loop whose killed-and-resumed
  runs end bitwise equal to an uninterrupted one.
- ``jax_state``: a JAX train state with Orbax (``CheckpointManager``, async save, keep-last-N).
- ``ppo_resume``: lesson 04's jitted PPO, resumable bit-exact from Orbax checkpoints.
- ``sharded``: sharded torch state with ``torch.distributed.checkpoint``, saved by N ranks
  and loaded by M (resharding on load).
- ``interval``: how often to checkpoint: the waste model (10.1), Young's (10.2) and
  Daly's (10.3) optimal intervals, asynchronous save (10.4), a Monte Carlo check.

Importing the package imports none of its modules (no torch, JAX or Orbax): import the
one you need, e.g. ``from course_lib.checkpoint.atomic import commit, restore_latest``.
"""
