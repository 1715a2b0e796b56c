"""CUDA backend: CuPy ops over `kernels/*.cu`, a weight arena and decode-step CUDA graphs.

Importing this package (or `backend`) does not import CuPy, start CUDA or compile anything;
kernels are compiled on first use (modules.py) and cached on disk by CuPy.
"""
