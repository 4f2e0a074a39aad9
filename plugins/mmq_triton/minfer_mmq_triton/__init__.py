"""minfer plugin: Triton matmuls over quantized GGUF weights (see ``plugin`` for the hooks)."""

__version__ = "0.1.0"
