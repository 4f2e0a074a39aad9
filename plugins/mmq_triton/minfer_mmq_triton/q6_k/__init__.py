"""q6_K: 256-value blocks of 6-bit values with int8 scales per 16 values."""
