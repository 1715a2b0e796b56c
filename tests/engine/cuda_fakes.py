"""Stand-ins for the CUDA side of the backend's choices, for tests without a GPU: a card's
properties as launch.py caches them, a device array as the choice code reads it, and a
launcher that records launches instead of making them."""

from __future__ import annotations

import numpy as np

from engine.backends.cuda import launch
from engine.backends.cuda.card import Card


def use_card(monkeypatch, card: Card) -> None:
    """launch.py's cached properties of a device (id 7) set to `card`'s; nothing asks CUDA."""
    import cupy

    class _Device:
        id = 7

    props = {
        "multiProcessorCount": card.sm_count,
        "l2CacheSize": card.l2_bytes,
        "sharedMemPerBlockOptin": card.smem_per_block,
    }
    monkeypatch.setattr(cupy.cuda, "Device", _Device)
    monkeypatch.setattr(launch, "_PROPERTIES", {7: props})
    monkeypatch.setattr(launch, "_CAPABILITY", {7: card.capability})
    monkeypatch.setattr(launch, "_driver_launch", lambda: object())  # cuLaunchKernelEx exists


class DeviceArray:
    """A device array as the choice and launch code read it: shape, strides, pointer."""

    def __init__(self, shape: tuple, itemsize: int = 2) -> None:
        self.shape, self.itemsize = shape, itemsize
        self.strides = (shape[-1] * itemsize, itemsize)[-len(shape) :]
        self.data = type("D", (), {"ptr": 1 << 20})()
        self.nbytes = int(np.prod(shape)) * itemsize

    def __getitem__(self, index: slice | tuple) -> DeviceArray:
        """Rows (a slice), or rows and columns (two): a view with the same strides, its
        pointer moved."""
        cuts = index if isinstance(index, tuple) else (index,)
        shape, ptr = list(self.shape), self.data.ptr
        for axis, cut in enumerate(cuts):
            start, stop, _ = cut.indices(shape[axis])
            shape[axis], ptr = stop - start, ptr + start * self.strides[axis]
        out = DeviceArray(tuple(shape), self.itemsize)
        out.strides = self.strides
        out.data = type("D", (), {"ptr": ptr})()
        return out


class Fn:
    """A compiled kernel as a launch reads it."""

    def __init__(self, name: str) -> None:
        self.name, self.kernel = name, type("K", (), {"ptr": 1})()


class RecordingKernels:
    """launch.Kernels for bf16 activations that records (symbol, grid, block, shared bytes,
    arguments) instead of launching."""

    dtype, act_itemsize, graphing, prefetch = "bfloat16", 2, False, False

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def allow_smem(self, fn, key, smem) -> None:
        pass

    def launch(self, fn, grid, block, args, smem=0) -> None:
        self.launches.append((fn.name, tuple(grid), tuple(block), smem, args))

    def run(self, file, symbol, grid, block, args, smem=0) -> None:
        self.launch(Fn(symbol), grid, block, args, smem)

    def fn(self, file, symbol) -> Fn:
        return Fn(symbol)
