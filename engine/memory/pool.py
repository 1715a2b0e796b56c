"""Device memory pools: the real one (CuPy) and a simulated one for host tests.

Every device byte the engine holds goes through a pool, tagged (`"arena"`, `"scratch"`,
`"stream:0"`, `"prompt_cache:3"`, ...). The part of a tag before the first `:` is its category.
A pool knows what it holds per tag, what the card has free, and an optional limit: with a
limit, an allocation that would take the engine's holdings past it fails exactly like a real
out-of-memory, which is how a large card stands in for a small one.

Both pools raise `DeviceOutOfMemory` (with `.nbytes` and `.category`) for a failed
allocation; the growth paths turn that into `ScratchGrowFailed` / `WorkspaceGrowFailed`.
`fail_next(tag or category, n)` makes the next n allocations of that kind fail the same way
(the fault tests, tests/device/test_faults.py; an empty dict check when nothing is armed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.errors import DeviceOutOfMemory

FailRule = set[int | str] | frozenset[int | str] | Callable[[int, str, int], bool] | None


class Allocation(Protocol):
    """One live device block. `free()` returns it to the pool (a second call does nothing)."""

    nbytes: int
    tag: str

    def free(self) -> None: ...

    def view(self, offset: int, shape: tuple[int, ...], dtype: str) -> Any: ...


class DevicePool(Protocol):
    """What the memory code needs from a device; see `CupyPool` and `SimulatedPool`."""

    limit: int | None

    def alloc(self, nbytes: int, tag: str) -> Allocation: ...

    @property
    def held_bytes(self) -> int: ...

    def held_by_tag(self) -> dict[str, int]: ...

    def card_free(self) -> int: ...

    def card_total(self) -> int: ...


def category_of(tag: str) -> str:
    """`"stream:2"` -> `"stream"`."""
    return tag.split(":", 1)[0]


# What each category holds, and the setting that makes room for it.
_LIMIT = "raise the memory limit (SNUG_MEMORY_LIMIT_GIB)"
_WHAT = {
    "weights": (
        "the model's weights",
        f"choose a smaller model or a 4-bit checkpoint, or {_LIMIT}",
    ),
    "stream": (
        "the streams' KV cache and DeltaNet state",
        f"lower the context or the number of streams, or {_LIMIT}",
    ),
    "prompt_cache": (
        "a saved prompt state",
        f"the next turn prefills its history instead; {_LIMIT} to keep more saved states",
    ),
}
_DEFAULT = ("", f"lower the context, the number of streams or max rows, or {_LIMIT}")


def _oom(nbytes: int, tag: str, why: str) -> DeviceOutOfMemory:
    what, hint = _WHAT.get(category_of(tag), _DEFAULT)
    what = f"{what} ({tag!r})" if what else repr(tag)
    err = DeviceOutOfMemory(
        f"device allocation of {nbytes:,} bytes for {what} failed: {why}; {hint}"
    )
    err.nbytes = nbytes
    err.category = category_of(tag)
    err.tag = tag
    return err


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether a CuPy or CUDA exception means the device (or pinned host memory) had no room:
    CuPy's OutOfMemoryError, or a runtime or driver error of status 2 (cudaErrorMemoryAllocation,
    CUDA_ERROR_OUT_OF_MEMORY). Called in `except` clauses of the CUDA path only."""
    import cupy

    if isinstance(exc, cupy.cuda.memory.OutOfMemoryError):
        return True
    errors = (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError)
    return isinstance(exc, errors) and getattr(exc, "status", None) == 2


class _Ledger:
    """Per-tag bookkeeping shared by both pools."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._held: dict[int, tuple[str, int]] = {}
        self._next_id = 0
        self.peak_bytes = 0  # the most held at once (receipts compare it with the plan)
        self._faults: dict[str, int] = {}  # tag or category -> allocations still to fail

    def reset_peak(self) -> None:
        """Start `peak_bytes` again from what is held now (a receipt's request measures the
        peak of its own)."""
        self.peak_bytes = self.held_bytes

    def fail_next(self, what: str, count: int = 1) -> None:
        """Make the next `count` allocations whose tag or category is `what` fail as an
        out-of-memory does (DeviceOutOfMemory, nothing allocated); count 0 disarms."""
        if count < 0:
            raise ValueError(f"count {count} must be >= 0")
        if count:
            self._faults[what] = count
        else:
            self._faults.pop(what, None)

    def pending_faults(self) -> dict[str, int]:
        """The failures armed by `fail_next` and not yet reached."""
        return dict(self._faults)

    def _injected_fault(self, nbytes: int, tag: str) -> None:
        if not self._faults:
            return
        for key in (tag, category_of(tag)):
            left = self._faults.get(key, 0)
            if left:
                self.fail_next(key, left - 1)
                raise _oom(nbytes, tag, f"an injected failure (fail_next({key!r}))")

    @property
    def held_bytes(self) -> int:
        return sum(n for _, n in self._held.values())

    def held_by_tag(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for tag, n in self._held.values():
            out[tag] = out.get(tag, 0) + n
        return out

    def held_by_category(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for tag, n in self._held.values():
            cat = category_of(tag)
            out[cat] = out.get(cat, 0) + n
        return out

    def _check_limit(self, nbytes: int, tag: str) -> None:
        if self.limit is not None and self.held_bytes + nbytes > self.limit:
            raise _oom(
                nbytes,
                tag,
                f"the memory limit is {self.limit:,} bytes and {self.held_bytes:,} are held",
            )

    def _record(self, tag: str, nbytes: int) -> int:
        key = self._next_id
        self._next_id += 1
        self._held[key] = (tag, nbytes)
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        return key

    def _release(self, key: int) -> None:
        self._held.pop(key, None)


# ---------------------------------------------------------------------------------------------
# Simulated


@dataclass(frozen=True)
class SimView:
    """A carved view into a simulated block: enough to check offsets and identity."""

    block: int
    offset: int
    shape: tuple[int, ...]
    dtype: str


class SimAllocation:
    """A block of a `SimulatedPool`; `block` is unique for the pool's lifetime."""

    def __init__(self, pool: SimulatedPool, key: int, nbytes: int, tag: str) -> None:
        self._pool = pool
        self.block = key
        self.nbytes = nbytes
        self.tag = tag
        self.freed = False

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            self._pool._release(self.block)
            self._pool.events.append(("free", self.tag, self.block))

    def view(self, offset: int, shape: tuple[int, ...], dtype: str) -> SimView:
        assert not self.freed, "view of a freed block"
        return SimView(self.block, offset, tuple(shape), dtype)


class SimulatedPool(_Ledger):
    """A byte budget that behaves like a card, with failures injected on demand.

    total_bytes: the card's size. other_used: bytes other programs hold (the desktop).
    fail_at: allocations to fail as out-of-memory: a set of sequence numbers (0 = the pool's
    first `alloc` call) and/or tags or categories, or a callable `(seq, tag, nbytes) -> bool`.
    It may be replaced at any time. `events` records ("alloc"/"fail"/"free", tag, block).
    """

    def __init__(
        self,
        total_bytes: int,
        other_used: int = 0,
        fail_at: FailRule = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(limit)
        self.total_bytes = total_bytes
        self.other_used = other_used
        self.fail_at = fail_at
        self.seq = 0
        self.events: list[tuple[str, str, int]] = []

    def _injected(self, seq: int, tag: str, nbytes: int) -> bool:
        rule = self.fail_at
        if rule is None:
            return False
        if callable(rule):
            return bool(rule(seq, tag, nbytes))
        return seq in rule or tag in rule or category_of(tag) in rule

    def alloc(self, nbytes: int, tag: str) -> SimAllocation:
        seq = self.seq
        self.seq += 1
        try:
            if nbytes < 0:
                raise ValueError(f"negative allocation {nbytes} for {tag!r}")
            if self._injected(seq, tag, nbytes):
                raise _oom(nbytes, tag, f"injected failure at allocation #{seq}")
            self._injected_fault(nbytes, tag)
            self._check_limit(nbytes, tag)
            if nbytes > self.card_free():
                raise _oom(nbytes, tag, f"the card has {self.card_free():,} bytes free")
        except DeviceOutOfMemory:
            self.events.append(("fail", tag, -1))
            raise
        key = self._record(tag, nbytes)
        self.events.append(("alloc", tag, key))
        return SimAllocation(self, key, nbytes, tag)

    def card_free(self) -> int:
        return self.total_bytes - self.other_used - self.held_bytes

    def card_total(self) -> int:
        return self.total_bytes


# ---------------------------------------------------------------------------------------------
# Real


class CupyAllocation:
    """A raw device block; `pointer` is a `cupy.cuda.MemoryPointer` to its first byte."""

    def __init__(self, pool: CupyPool, key: int, memory: Any, nbytes: int, tag: str) -> None:
        import cupy

        self._pool = pool
        self._key = key
        self._memory = memory
        self.pointer = cupy.cuda.MemoryPointer(memory, 0)
        self.nbytes = nbytes
        self.tag = tag

    def free(self) -> None:
        if self._memory is not None:
            self._pool._release(self._key)
            self.pointer = None
            self._memory = None  # the last reference: cudaFree happens here

    def view(self, offset: int, shape: tuple[int, ...], dtype: str) -> Any:
        import cupy

        assert self._memory is not None, "view of a freed block"
        return cupy.ndarray(shape, dtype=dtype, memptr=self.pointer + offset)

    def array(self, shape: tuple[int, ...], dtype: str) -> Any:
        """The whole block (or its start) as one array."""
        return self.view(0, shape, dtype)


class CupyPool(_Ledger):
    """Device memory through CuPy; CuPy is imported on first use, not at import.

    Blocks are raw `cupy.cuda.Memory` allocations rather than CuPy's caching pool, so a freed
    block is really returned to the card and `card_free()` (cudaMemGetInfo) stays truthful
    after a buffer is replaced by a larger one.
    """

    def __init__(self, limit: int | None = None, device: int = 0) -> None:
        super().__init__(limit)
        self.device = device

    def alloc(self, nbytes: int, tag: str) -> CupyAllocation:
        import cupy

        self._injected_fault(nbytes, tag)
        self._check_limit(nbytes, tag)
        try:
            with cupy.cuda.Device(self.device):
                memory = cupy.cuda.Memory(max(nbytes, 1))
        except (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.runtime.CUDARuntimeError) as exc:
            raise _oom(nbytes, tag, str(exc)) from exc
        key = self._record(tag, nbytes)
        return CupyAllocation(self, key, memory, nbytes, tag)

    def _mem_info(self) -> tuple[int, int]:
        import cupy

        with cupy.cuda.Device(self.device):
            free, total = cupy.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def card_free(self) -> int:
        return self._mem_info()[0]

    def card_total(self) -> int:
        return self._mem_info()[1]
