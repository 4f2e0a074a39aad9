"""minfer plugin: the decode step captured once as a CUDA graph and replayed for every token."""

__version__ = "0.1.0"
