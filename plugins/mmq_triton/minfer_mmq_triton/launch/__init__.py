"""Launch plumbing shared by the kernels: PDL, split-K, scratch buffers, x prologue, Gluon helpers."""
