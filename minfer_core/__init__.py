"""minfer: run GGUF language models from Python (Triton kernels on NVIDIA GPUs, torch on the CPU)."""

__version__ = "0.1.0"
