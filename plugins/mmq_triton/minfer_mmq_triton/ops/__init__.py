"""Kernels that are not quantized matmuls: attention, RoPE + KV write, norms, producers, x quantizer."""
