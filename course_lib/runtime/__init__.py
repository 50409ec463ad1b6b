"""The runtime floor every system of the course stands on (lessons 03, 07, 09, and the next).

- :mod:`course_lib.runtime.processes`: child processes and their lifecycle
  (``ChildProcessSystem``, ``stop_processes``, the parent watchdog, exit reasons,
  ``free_port``, what is still alive).
- :mod:`course_lib.runtime.ranks`: N torch.distributed ranks on this machine (``RankGroup``:
  start, join the group with a timeout, report through a queue, always stop).
- :mod:`course_lib.runtime.weights`: weights shared between processes (flat parameters,
  the versioned seqlock ``SharedWeights``).

A system (``actor_learner``, ``pipeline``, ``weight_sync``) imports from here and from the
RL library, never from another system.
"""
