"""Pipeline RL (lesson 07): three RL regimes for a language-model policy with real processes.

* :mod:`.loss`: per-token truncated-IS loss, group advantages on tokens, per-token lags, ESS
  (eq. 07.1-07.4);
* :mod:`.system`: :class:`~.system.PipelineSystem`, a generator process and the trainer, in
  the ``sync``, ``one_step`` or ``pipeline`` regime, with backpressure that bounds the lag,
  and clean shutdown on faults;
* :mod:`.timeline`: timelines (Gantt), learning curves, lag histograms.
"""
