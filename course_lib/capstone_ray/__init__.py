"""Lesson 12, the capstone's second part: lesson 11's run on Ray, one controller driving placed actors.

Modules (importing the package imports none of them; none imports Ray at module level):

* :mod:`.placement`: ``bundles_for(layout)``: lesson 08's layouts (``sync_colocated``,
  ``sync_split``, ``pipeline``) as placement-group bundles and per-actor CPU (and GPU) shares;
  ``plan_devices``: CPUs and gloo, or a GPU per bundle and NCCL.
* :mod:`.cores`: the node-local core claim each pinned actor makes (``choose_core``, ``claim_core``).
* :mod:`.admission`: ``admit(...)``: which groups each idle generator starts now, under the lag bound.
* :mod:`.ledger`: ``Ledger`` (sample identities and the audit), ``on_generator_death``.
* :mod:`.cluster`: ``start_ray``/``stop_ray`` (bounded, quiet, nothing left), ``loopback_only``,
  ``listening_addresses``.
* :mod:`.workers`: ``TrainerWorker``, ``GeneratorWorker`` (plain classes; the controller applies
  ``ray.remote``).
* :mod:`.controller`: ``RayRunConfig``, ``Controller``, ``check_run``, ``run(cfg) -> dict``.
* :mod:`.syncbench`: ``compare(sizes)``: lesson 09's engine on a gloo group vs Ray's object store.
* :mod:`.report`: side-by-side rows, phases, the kill timeline, reward vs wall clock, and
  ``run_torchrun_same_task`` (lesson 11's job on the same task).
* ``python -m course_lib.capstone_ray run --layout pipeline --kill-at 40``: one run, JSON out
  (inside a loopback-only namespace: ``python -m course_lib.runtime.netns -- ...``).

The standalone gloo group the weight sync runs on is :class:`course_lib.runtime.groups.StandaloneGroup`.
"""
