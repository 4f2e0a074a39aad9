"""minfer plugin: the decode step (the prefill step per prompt bucket, the batched engine's
decode-only step per entry count) captured once as a CUDA graph and replayed for every token
(prompt, batched step)."""

__version__ = "0.1.0"
