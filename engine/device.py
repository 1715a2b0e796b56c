"""What NVIDIA GPU is here, read through NVML only.

NVML is the driver's management library: asking it never creates a CUDA context, so the app
can show the card and its free memory before anything is loaded, and importing this module
starts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.backends.cuda.card import runs_mma
from engine.memory.speed import CardSpeed, card_speed


@dataclass(frozen=True)
class GpuInfo:
    """One card as NVML reports it; byte counts are the whole card, every process included."""

    name: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    driver: str
    speed: CardSpeed | None = None  # what bounds prefill and decode (None: NVML cannot say)
    capability: int = 0  # 10 * major + minor (0: NVML cannot say)

    @property
    def fused_attention(self) -> bool:
        """The CUDA backend runs prefill attention fused here (tensor cores and cp.async:
        `runs_mma`; every such card's blocks hold a tile of it), so a plan gives the
        workspace no scores (engine.memory.admission.Card)."""
        return runs_mma(self.capability)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_gpu(index: int = 0) -> GpuInfo | None:
    """Describe GPU `index`, or return None when there is none (or NVML cannot tell)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # every NVML failure means "no usable GPU" to the caller
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        name = _text(pynvml.nvmlDeviceGetName(handle))
        capability = nvml_capability(pynvml, handle)
        return GpuInfo(
            name=name,
            total_bytes=int(mem.total),
            free_bytes=int(mem.free),
            used_bytes=int(mem.used),
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            speed=nvml_speed(pynvml, handle, name, capability),
            capability=capability,
        )
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def nvml_capability(pynvml: Any, handle: Any) -> int:
    """10 * major + minor, as NVML reports the card's compute capability (0: it cannot)."""
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    except Exception:  # an older driver: unknown (planned as a card without fused kernels)
        return 0
    return 10 * int(major) + int(minor)


def nvml_speed(pynvml: Any, handle: Any, name: str, capability: int) -> CardSpeed | None:
    """Bandwidth (memory clock x 2 transfers x bus width) and tensor throughput (SMs from
    the CUDA cores, at the maximum SM clock) as NVML reports them (`nvml_capability`'s
    answer for the card)."""
    if not capability:
        return None
    try:
        cores = int(pynvml.nvmlDeviceGetNumGpuCores(handle))
        sm_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
        mem_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
    except Exception:  # an older driver lacks some of these: no prediction, not an error
        return None
    bandwidth = mem_mhz * 1e6 * 2 * bus_bits / 8
    return card_speed(name, capability, cores, sm_mhz * 1e6, bandwidth)


def no_gpu_reason() -> str:
    """Why there is no usable NVIDIA GPU, in words for a person; "" when there is one."""
    try:
        import pynvml
    except ImportError:
        return "No NVIDIA GPU found: the nvidia-ml-py package (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return "No NVIDIA GPU found: the NVIDIA driver library (NVML) is not installed"
    except pynvml.NVMLError_DriverNotLoaded:
        return "No NVIDIA GPU found: the NVIDIA driver is installed but not loaded"
    except pynvml.NVMLError_NoPermission:
        return "No NVIDIA GPU found: no permission to open the NVIDIA driver"
    except Exception as exc:
        return f"No NVIDIA GPU found: NVML failed to start ({exc})"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "No NVIDIA GPU found: the driver is loaded but reports no device"
        return ""
    except Exception as exc:
        return f"No NVIDIA GPU found: NVML could not list devices ({exc})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
