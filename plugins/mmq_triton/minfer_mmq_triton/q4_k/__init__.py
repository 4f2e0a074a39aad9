"""q4_K: 256-value blocks of 4-bit values with packed 6-bit scales and mins."""
