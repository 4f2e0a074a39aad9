"""minfer plugin: dense matmuls over a bf16 copy of each weight it serves (the MINFER_MMQ=0 path)."""

__version__ = "0.1.0"
