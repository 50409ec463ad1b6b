"""The RL maths and the problems to test it on (lessons 01-03), pure functions and small loops.

- ``pg``: returns, advantages, the policy-gradient estimators (01)
- ``bandits``, ``verifiable``: problems with exact gradients (01)
- ``reinforce``: REINFORCE on CartPole, the first training loop (01)
- ``importance``: importance ratios, ESS, truncation, the clipped surrogate (02)
- ``staleness``: the staleness grid (02) and the backpressure rule that bounds the lag (07, 11)
- ``vtrace``: V-trace targets and policy-gradient advantages (03)

Import the module you need (``from course_lib.rl import vtrace``): this file imports nothing,
so ``course_lib.rl.pg`` costs no torch or JAX it does not use.
"""
