"""The legacy 32-value block types: q4_0, q4_1, q5_0, q5_1, q8_0."""
