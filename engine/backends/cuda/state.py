"""Per-stream state of the CUDA backend: KV cache, conv and recurrent state, snapshots.

One pool block holds every stream's state, one slot per stream (no spare slot: warm-up runs
on the slots before any stream is live, and a graph capture executes nothing):

    kv_k, kv_v  [full layers, slots, Hkv, context, hd]   activation type (int8 codes in
                                                         the 8-bit cache)
    conv        [linear layers, slots, K-1, C]           activation type
    recurrent   [linear layers, slots, Hv, dv, dk]       fp32 (value column contiguous)
    kv_k_scale, [full layers, slots, Hkv, context]       fp32, the 8-bit cache only: one
    kv_v_scale                                           scale per token and KV head

A saved stream (prompt cache) is a copy of one slot: a dict with its `length` and the four
copies, in its own `prompt_cache` pool block (`block`), or, where the plan put the saved
states in host memory (invariant 8: they leave the card before the prefill chunks shrink),
in pinned host memory (`pinned`), copied over PCIe in contiguous runs with no device
buffer in between. For the host and disk tiers a snapshot becomes a `HostSnapshot`
(`snapshot_to_host`: views of the pinned buffer, or one copy of a block into a new pinned
one; a restore from disk reads the file into the spare pinned buffer where it holds it,
`give_spare`, and hands it back once the slot holds the state), one array per layer and
part, bf16 as uint16 bits:

    kv_k.<i>, kv_v.<i>   [Hkv, length, hd]   activation type (int8 in the 8-bit cache)
    conv.<i>             [K-1, C]            activation type
    recurrent.<i>        [Hv, dv, dk]        fp32
    kv_k_scale.<i>,      [Hkv, length]       fp32 (the 8-bit cache only)
    kv_v_scale.<i>

and `restore_slot` takes one back (checked exactly against this state first). An embedding
table kept off the card (invariant 7) is held here too (`host_table`, host_table.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.backends.base import KV_SCALE_PARTS, STATE_PARTS
from engine.backends.cuda.launch import Kernels, on_stream
from engine.errors import DeviceOutOfMemory
from engine.memory.arena import ALIGN, padded
from engine.model_config import ModelConfig
from engine.snapshot_store import HostSnapshot, SnapshotMismatch


class StreamState:
    def __init__(self, kernels: Kernels, pool: Any, stream: Any) -> None:
        self.k, self.pool, self.stream = kernels, pool, stream
        self.config: ModelConfig | None = None
        self.slots = 0
        self.context = 0
        self.block: Any = None
        self.kv_k: Any = None
        self.kv_v: Any = None
        self.conv: Any = None
        self.recurrent: Any = None
        # The 8-bit KV cache (EngineSettings.kv_cache "int8", set by the backend before
        # `alloc`): kv_k / kv_v hold int8 codes and these their fp32 scales.
        self.kv_int8 = False
        # Drafting (Backend.draft_tokens, set before `alloc`): the MTP head's KV layer comes
        # after the model's full-attention layers, and is saved with the slot.
        self.mtp_layers = 0
        self.kv_k_scale: Any = None
        self.kv_v_scale: Any = None
        # Invariant 7: when the plan has no room for an untied embedding table on the card,
        # it stays in mapped pinned host memory (`host_table`), which the gather reads in
        # place, inside a captured graph like the rest of the step.
        self.host_table: Any = None
        self.snapshots_on_host = False  # the plan's choice (Decision.prompt_cache_on_host)
        # A pinned buffer for one whole-context state, allocated off a reply's path
        # (`keep_spare`): a device snapshot moved to host memory during a reply takes it and
        # costs one copy queued on the stream, with no allocation and no wait; a restore
        # from disk reads the saved file into it (`give_spare`), and copies to the card
        # from pinned memory.
        self._spare: np.ndarray | None = None
        # Pinned buffers of exactly the host size of the device snapshots the prompt cache
        # would move to host memory next (`keep_ready`), pinned at a request's end: a save
        # inside the next reply that evicts one copies into its buffer. Pinning there stalled
        # the reply (40 to 46 ms for a 4B state of 800 tokens on the H200's host, 9 to 10
        # ms for the 0.8B's), and the spare takes only states of at least half its size.
        self._ready: list[np.ndarray] = []
        self._copies_pending = False  # device-to-host copies queued and not yet waited for

    def alloc(self, config: ModelConfig, slots: int, context: int) -> None:
        """Carve and zero the state block of `slots` streams of up to `context` tokens (the
        previous one, if any, freed first with `free`)."""
        import cupy

        self.config, self.slots, self.context = config, slots, context
        c, n, act = config, slots, self.k.act_dtype
        layers = len(c.full_layers) + self.mtp_layers
        kv = (layers, n, c.num_key_value_heads, self.context, c.head_dim)
        conv = (len(c.linear_layers), n, c.linear_conv_kernel_dim - 1, c.conv_dim)
        Hv, dv, dk = c.linear_num_value_heads, c.linear_value_head_dim, c.linear_key_head_dim
        rec = (len(c.linear_layers), n, Hv, dv, dk)
        kv_t = cupy.int8 if self.kv_int8 else act
        shapes = [(kv, kv_t), (kv, kv_t), (conv, act), (rec, cupy.float32)]
        if self.kv_int8:
            shapes += [(kv[:-1], cupy.float32)] * 2
        self.block, arrays = self.carve_block(shapes, "stream")
        self.kv_k, self.kv_v, self.conv, self.recurrent = arrays[:4]
        self.kv_k_scale, self.kv_v_scale = arrays[4:] if self.kv_int8 else (None, None)
        for arr in arrays:
            arr.fill(0)

    @property
    def parts(self) -> tuple[str, ...]:
        """A snapshot's parts: STATE_PARTS, then the 8-bit cache's scales."""
        return STATE_PARTS + (KV_SCALE_PARTS if self.kv_int8 else ())

    def _arrays(self) -> list[Any]:
        """The state's arrays, in `parts` order."""
        return [getattr(self, part) for part in self.parts]

    def free(self) -> None:
        if self.block is not None:
            self.block.free()
        self.block = None

    def carve_block(self, shapes: list, tag: str) -> tuple[Any, list[Any]]:
        """One pool block holding arrays of `shapes` [(shape, dtype)], each 256-aligned."""
        import cupy

        sizes = [padded(int(np.prod(sh)) * cupy.dtype(dt).itemsize) for sh, dt in shapes]
        block = self.pool.alloc(max(sum(sizes), ALIGN), tag)
        arrays, offset = [], 0
        for (shape, dtype), size in zip(shapes, sizes, strict=True):
            arrays.append(block.view(offset, shape, cupy.dtype(dtype).name))
            offset += size
        return block, arrays

    def reset_slot(self, slot: int) -> None:
        with on_stream(self.stream):  # ordered with the forwards on the backend's stream
            for arr in self._arrays():
                arr[:, slot] = 0

    def _runs(self, slot: int, length: int) -> dict[str, list[Any]]:
        """One slot's state as contiguous device runs, in snapshot order per part: KV (and
        its scales) per (layer, head) over the first `length` tokens, conv and recurrent
        per layer."""
        L, H = self.kv_k.shape[0], self.kv_k.shape[2]
        kv = [(layer, h) for layer in range(L) for h in range(H)]
        runs = {
            "kv_k": [self.kv_k[layer, slot, h, :length] for layer, h in kv],
            "kv_v": [self.kv_v[layer, slot, h, :length] for layer, h in kv],
            "conv": [self.conv[layer, slot] for layer in range(self.conv.shape[0])],
            "recurrent": [self.recurrent[layer, slot] for layer in range(self.recurrent.shape[0])],
        }
        for part in KV_SCALE_PARTS if self.kv_int8 else ():
            runs[part] = [getattr(self, part)[layer, slot, h, :length] for layer, h in kv]
        return runs

    @staticmethod
    def _pinned(total: int) -> np.ndarray:
        """`total` bytes of pinned host memory as a uint8 array (the buffer lives as long
        as the array or a view of it); DeviceOutOfMemory when the host has none to pin."""
        import cupy

        try:
            # Not through CuPy's pinned pool, which keeps every freed block for a later one
            # of the same size: saved states seldom repeat a size, so the host's locked
            # memory would only grow. This buffer goes back to the host with its last view.
            pinned = cupy.cuda.PinnedMemoryPointer(cupy.cuda.PinnedMemory(max(total, 1)), 0)
        except (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.runtime.CUDARuntimeError) as exc:
            raise DeviceOutOfMemory(
                f"no pinned host memory for a saved prompt state of {total} bytes ({exc}); "
                "lower the prompt cache's host budget (SNUG_PROMPT_CACHE_HOST_GIB)"
            ) from None
        return np.frombuffer(pinned, np.uint8, total)

    def _save_to_host(self, slot: int, length: int) -> dict:
        """The slot's state copied into one pinned host buffer (freed with the snapshot)."""
        runs = self._runs(slot, length)
        total = sum(r.nbytes for part in runs.values() for r in part)
        flat = self._pinned(total)
        snapshot: dict = {"length": length, "pinned": flat, "nbytes": total}
        offset = 0
        for name, part in runs.items():
            start = offset
            for run in part:
                run.data.copy_to_host_async(flat[offset:].ctypes.data, run.nbytes, self.stream)
                offset += run.nbytes
            snapshot[name] = flat[start:offset]
        self.stream.synchronize()
        return snapshot

    def save_slot(self, slot: int, length: int) -> dict:
        """A copy of one stream's state: in pinned host memory where the plan put the saved
        states, else in its own `prompt_cache` pool block (raises DeviceOutOfMemory when
        the card or the limit has no room for it)."""
        if self.snapshots_on_host:
            return self._save_to_host(slot, length)
        parts = {
            "kv_k": self.kv_k[:, slot, :, :length],
            "kv_v": self.kv_v[:, slot, :, :length],
            "conv": self.conv[:, slot],
            "recurrent": self.recurrent[:, slot],
        }
        for part in KV_SCALE_PARTS if self.kv_int8 else ():
            parts[part] = getattr(self, part)[:, slot, :, :length]
        block, copies = self.carve_block(
            [(a.shape, a.dtype) for a in parts.values()], "prompt_cache"
        )
        with on_stream(self.stream):
            for dst, src in zip(copies, parts.values(), strict=True):
                dst[...] = src
        return {"length": length, "block": block, **dict(zip(parts, copies, strict=True))}

    def restore_slot(self, slot: int, snapshot: dict | HostSnapshot) -> None:
        self.reset_slot(slot)
        if isinstance(snapshot, HostSnapshot):
            self._restore_host_snapshot(slot, snapshot)
            return
        if "pinned" in snapshot:  # restored through its host views (no copy made)
            self._restore_host_snapshot(slot, self.snapshot_to_host(snapshot))
            return
        n = snapshot["length"]
        with on_stream(self.stream):
            self.kv_k[:, slot, :, :n] = snapshot["kv_k"]
            self.kv_v[:, slot, :, :n] = snapshot["kv_v"]
            self.conv[:, slot] = snapshot["conv"]
            self.recurrent[:, slot] = snapshot["recurrent"]
            for part in KV_SCALE_PARTS if self.kv_int8 else ():
                getattr(self, part)[:, slot, :, :n] = snapshot[part]

    # ----- host snapshots (the host and disk tiers) ----------------------------------------
    def _host_layout(self, length: int) -> dict[str, list[tuple[tuple[int, ...], Any]]]:
        """Per part, each layer's (shape, dtype) in a HostSnapshot of `length` tokens."""
        act, f32 = np.dtype(self.k.act_dtype), np.dtype(np.float32)  # uint16: bf16 bits
        L, _, H, _, hd = self.kv_k.shape
        kv = [((H, length, hd), np.dtype(self.kv_k.dtype))] * L
        layout = {
            "kv_k": kv,
            "kv_v": kv,
            "conv": [(tuple(self.conv.shape[2:]), act)] * self.conv.shape[0],
            "recurrent": [(tuple(self.recurrent.shape[2:]), f32)] * self.recurrent.shape[0],
        }
        for part in KV_SCALE_PARTS if self.kv_int8 else ():
            layout[part] = [((H, length), f32)] * L
        return layout

    def _host_views(self, length: int, parts: dict[str, np.ndarray]) -> HostSnapshot:
        """A HostSnapshot over `parts` (per part its bytes, uint8, layers end to end: the
        byte order of a block's copy and of a pinned snapshot alike)."""
        arrays = {}
        for part, layers in self._host_layout(length).items():
            flat, offset = parts[part], 0
            for i, (shape, dtype) in enumerate(layers):
                nbytes = int(np.prod(shape)) * dtype.itemsize
                arrays[f"{part}.{i}"] = flat[offset : offset + nbytes].view(dtype).reshape(shape)
                offset += nbytes
            assert offset == flat.nbytes, (part, offset, flat.nbytes)
        return HostSnapshot(length, arrays)

    def snapshot_to_host(self, snapshot: dict, wait: bool = True) -> HostSnapshot:
        """A snapshot as host arrays: views of a pinned snapshot's buffer (no copy), or one
        copy of a block's arrays into pinned memory (a buffer readied for it, or with
        `wait=False` the spare where it is big enough; else a new buffer). The views keep the
        buffer alive after `free_snapshot`. With `wait=False` the copy is only queued on the
        stream: work queued after it (a restore, a reuse of the block's memory) is ordered
        after it, and whatever reads the arrays on the host calls `settle` first."""
        n = int(snapshot["length"])
        if "pinned" in snapshot:
            return self._host_views(n, {part: snapshot[part] for part in self.parts})
        sources = [snapshot[part] for part in self.parts]
        total = self.host_nbytes(snapshot)
        flat = self._take_ready(total)  # a move the prompt cache readied a buffer for
        if flat is None and not wait:
            flat = self._take_spare(total)
        if flat is None:
            flat = self._pinned(total)
        parts, offset = {}, 0
        for part, src in zip(self.parts, sources, strict=True):
            assert src.flags.c_contiguous  # carved from the snapshot's block
            if src.nbytes:
                src.data.copy_to_host_async(flat[offset:].ctypes.data, src.nbytes, self.stream)
            parts[part] = flat[offset : offset + src.nbytes]
            offset += src.nbytes
        if wait:
            self.stream.synchronize()  # the copies are done before the host reads them
            self._copies_pending = False
        else:
            self._copies_pending = True
        return self._host_views(n, parts)

    def settle(self) -> None:
        """Wait for the device-to-host copies `snapshot_to_host(wait=False)` queued."""
        if self._copies_pending:
            self.stream.synchronize()
            self._copies_pending = False

    def keep_spare(self) -> None:
        """Hold a pinned buffer for one whole-context state (allocated now, off a reply's
        path), unless one is held already."""
        need = self.snapshot_bytes(self.context)
        if self._spare is None or self._spare.nbytes < need:
            self._spare = None  # the old buffer goes before the new one is pinned
            self._spare = self._pinned(need)

    def keep_ready(self, snapshots: Sequence[dict]) -> None:
        """Hold one pinned buffer of each device snapshot's host size (`snapshots`: those
        the prompt cache would move next, oldest first), pinned now, off a reply's path.
        Buffers held of other sizes go back to the host before any new one is pinned, so
        at most the device snapshots' own bytes are held for them."""
        want = [self.host_nbytes(s) for s in snapshots if "pinned" not in s]
        held, self._ready = self._ready, []
        reuse: list[np.ndarray | None] = []
        for n in want:
            i = next((i for i, b in enumerate(held) if b.nbytes == n), None)
            reuse.append(None if i is None else held.pop(i))
        del held  # the unmatched buffers go with their last reference
        for n, buffer in zip(want, reuse, strict=True):
            self._ready.append(buffer if buffer is not None else self._pinned(n))

    def host_nbytes(self, snapshot: dict) -> int:
        """Bytes of a device snapshot's copy in host memory (`snapshot_to_host`)."""
        return sum(int(snapshot[part].nbytes) for part in self.parts)

    def _take_ready(self, total: int) -> np.ndarray | None:
        for i, buffer in enumerate(self._ready):
            if buffer.nbytes == total:
                return self._ready.pop(i)
        return None

    def _take_spare(self, total: int) -> np.ndarray | None:
        spare = self._spare
        if spare is None or not spare.nbytes // 2 <= total <= spare.nbytes:
            return None  # a small state pins its own buffer (the host tier counts its size)
        self._spare = None
        return spare[:total]

    def give_spare(self, nbytes: int) -> np.ndarray | None:
        """The spare pinned buffer, whole, where it holds `nbytes` (a restore from disk
        reads a saved file into it); None otherwise. Lent: `take_back_spare` once the slot
        holds what was read (restore_slot waits for its copies)."""
        spare = self._spare
        if spare is None or spare.nbytes < nbytes:
            return None
        self._spare = None
        return spare

    def take_back_spare(self, buffer: np.ndarray) -> None:
        """A buffer `give_spare` lent, no longer read: the spare again (unless one was
        pinned meanwhile, then it goes back to the host with its last view)."""
        if self._spare is None:
            self._spare = buffer

    def save_slot_to_host(self, slot: int, length: int) -> HostSnapshot:
        """The slot's state straight into pinned host memory (no device block)."""
        return self.snapshot_to_host(self._save_to_host(slot, length))

    def _restore_host_snapshot(self, slot: int, host: HostSnapshot) -> None:
        """Copy a HostSnapshot (pinned or pageable arrays) into the slot, run by run, after
        checking it is exactly this state's layout (SnapshotMismatch otherwise)."""
        self.settle()  # its arrays may be a queued copy's destination
        n = host.length
        if not 0 < n <= self.context:
            raise SnapshotMismatch(f"snapshot of {n} tokens for a context of {self.context}")
        layout = self._host_layout(n)
        host.check(
            {f"{p}.{i}": spec for p, layers in layout.items() for i, spec in enumerate(layers)}
        )
        a, H = host.arrays, self.kv_k.shape[2]
        per_head = ("kv_k", "kv_v", *(KV_SCALE_PARTS if self.kv_int8 else ()))
        sources = {
            part: [
                np.ascontiguousarray(a[f"{part}.{i}"][h])
                for i in range(len(layout[part]))
                for h in range(H)
            ]
            for part in per_head
        }
        for part in ("conv", "recurrent"):
            sources[part] = [
                np.ascontiguousarray(a[f"{part}.{i}"]) for i in range(len(layout[part]))
            ]
        for part, runs in self._runs(slot, n).items():
            for run, src in zip(runs, sources[part], strict=True):
                assert run.nbytes == src.nbytes, (part, run.nbytes, src.nbytes)
                run.data.copy_from_host_async(src.ctypes.data, run.nbytes, self.stream)
        # The host arrays (`sources`) must outlive the copies.
        self.stream.synchronize()

    def snapshot_bytes(self, length: int) -> int:
        """Bytes `save_slot` takes for a stream of `length` tokens."""
        c, isz = self.config, self.k.act_itemsize
        heads = (len(c.full_layers) + self.mtp_layers) * c.num_key_value_heads * length
        kv = heads * c.head_dim * (1 if self.kv_int8 else isz)
        conv = len(c.linear_layers) * (c.linear_conv_kernel_dim - 1) * c.conv_dim * isz
        rec = len(c.linear_layers) * c.linear_num_value_heads * c.linear_key_head_dim
        rec *= c.linear_value_head_dim * 4
        scales = (heads * 4,) * 2 if self.kv_int8 else ()
        return sum(-(-n // ALIGN) * ALIGN for n in (kv, kv, conv, rec, *scales))

    @staticmethod
    def snapshot_nbytes(snapshot: dict) -> int:
        """Bytes a snapshot holds: its block's, or its pinned host buffer's."""
        if "pinned" in snapshot:
            return int(snapshot["nbytes"])
        return int(snapshot["block"].nbytes)

    @staticmethod
    def free_snapshot(snapshot: dict) -> None:
        if "pinned" in snapshot:
            snapshot.clear()  # the pinned buffer goes with its last reference
            return
        snapshot["block"].free()
