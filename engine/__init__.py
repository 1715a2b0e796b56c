"""Snug's inference engine: checkpoints, memory planning, backends and generation.

Importing this package never starts CUDA and never imports Qt.
"""

__version__ = "0.1.0"
