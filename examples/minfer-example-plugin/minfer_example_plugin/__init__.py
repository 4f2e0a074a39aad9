"""An example minfer plugin: ``example.q8_0``, a Q8_0 matmul over planes built at registration."""

__version__ = "0.1.0"
