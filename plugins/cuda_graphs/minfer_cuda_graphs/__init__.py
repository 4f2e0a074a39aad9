"""minfer plugin: the decode step (and the prefill step per prompt bucket) captured once as a CUDA
graph and replayed for every token (prompt)."""

__version__ = "0.1.0"
