"""Which backend runs here: CUDA where an NVIDIA GPU, CuPy and the kernels for the card and
the model are all usable, else numpy, with the reason said (the app shows it)."""

from __future__ import annotations

import logging
from typing import Any

from engine.backends.base import Backend
from engine.config import EngineSettings
from engine.errors import BackendUnavailable
from engine.memory.admission import BASE_ROWS

log = logging.getLogger(__name__)


def select_backend(
    settings: EngineSettings, max_rows: int = BASE_ROWS, config: Any = None
) -> Backend:
    """`numpy`, `cuda`, or `auto` (cuda when an NVIDIA GPU and CuPy are usable, and its
    kernels cover the card and the model `config`; else numpy, and the log says why)."""
    choice = settings.backend
    if choice == "numpy":
        from engine.backends.numpy_backend import NumpyBackend

        return NumpyBackend(settings)
    reason = cuda_unavailable_reason()
    if reason is None:
        from engine.backends.cuda.backend import CudaBackend
        from engine.errors import UnsupportedModel

        try:
            backend = CudaBackend(
                settings=settings, dtype=_device_dtype(settings), max_rows=max_rows
            )
            if config is not None:
                backend.check_model(config)
            return backend
        except UnsupportedModel as exc:
            if choice == "cuda":
                raise
            reason = str(exc)
            log.warning("running on the CPU: %s", exc)
    if choice == "cuda":
        raise BackendUnavailable(
            f"backend 'cuda' cannot run here: {reason}. Choose the "
            "numpy (CPU) backend in settings or with --backend numpy"
        )
    from engine.backends.numpy_backend import NumpyBackend

    return NumpyBackend(settings)


def _device_dtype(settings: EngineSettings) -> str:
    """The compute dtype for this GPU: bf16 needs compute capability 8.0 (Ampere) or newer,
    so older cards (GTX 16xx, RTX 20xx) run in fp16 instead."""
    from engine.backends.cuda.launch import compute_capability

    if settings.compute_dtype == "bfloat16" and compute_capability() < 80:
        return "float16"
    return settings.compute_dtype


def cuda_unavailable_reason() -> str | None:
    """None when the CUDA backend can run; otherwise a sentence saying why not."""
    from engine.device import no_gpu_reason, probe_gpu

    if probe_gpu() is None:
        return no_gpu_reason()
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CUDA reports no device"
    except Exception as exc:  # ImportError, CUDARuntimeError: both mean no usable GPU
        return f"CuPy cannot use the GPU ({type(exc).__name__}: {exc})"
    try:
        import engine.backends.cuda.backend  # noqa: F401
    except ImportError as exc:
        return f"the CUDA backend is not available ({exc})"
    return None
