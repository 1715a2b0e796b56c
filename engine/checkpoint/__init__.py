"""Lazy safetensors reading with HF and MLX names normalised to Snug's internal naming."""

from engine.checkpoint.checkpoint import Checkpoint, TensorInfo
from engine.checkpoint.quantized import QuantizedTensor

__all__ = ["Checkpoint", "QuantizedTensor", "TensorInfo"]
