"""Laying out the cluster (lesson 08): how many GPUs generate, how many train, in which layout.

- :mod:`~course_lib.layout.model`: the first-principles throughput and staleness model.
- :mod:`~course_lib.layout.sim`: the same system, event by event (SimPy).
- :mod:`~course_lib.layout.calibrate`: the model fitted to lesson 07's measured parts.
- :mod:`~course_lib.layout.calc`: the calculator (a recommended layout from a few numbers).
- :mod:`~course_lib.layout.published`: published systems as data, and the model held against them.
"""
