"""Prefill matmuls (16 or more rows): raw-block expansion for every type, and the q4_K / q6_K plane GEMMs."""
