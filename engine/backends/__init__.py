"""Compute backends: numpy (host reference) and cuda (CuPy)."""
