"""A tiny decoder-only transformer and its KV-cache sampler (lesson 07).

* :mod:`.model`: :class:`TinyLM`, a full causal forward pass and a one-token decoding step
  that reads and writes a KV cache;
* :mod:`.sampler`: :class:`SlotSampler`, a batch of decoding *slots* (continuous batching)
  whose weights can be replaced between two decoding steps, keeping the cache or
  recomputing it, recording the behaviour log-prob and the policy version of every token;
* :mod:`.task`: the verifiable countdown task with a long tail of answer lengths, its exact
  verifier and a short supervised warm start.
"""

from course_lib.lm.model import LMConfig, TinyLM, sequence_logprobs
from course_lib.lm.sampler import SlotSampler
from course_lib.lm.task import CountdownTask, TaskConfig

__all__ = ["CountdownTask", "LMConfig", "SlotSampler", "TaskConfig", "TinyLM", "sequence_logprobs"]
