"""q5_K: 256-value blocks of 5-bit values with packed 6-bit scales and mins."""
