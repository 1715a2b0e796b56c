"""`CudaBackend`: the Qwen3.5 ops on an NVIDIA GPU through CuPy and `kernels/*.cu`.

Activations are bf16 (default), fp16 or fp32 (`dtype`; fp32 is the exactness mode) with
fp32 accumulation everywhere; the DeltaNet recurrent state is fp32; KV cache and conv state
are in the activation type. All work runs on one non-default stream, so a decode step can
be captured into a CUDA graph (graphs.py); code that switches streams for a while does it
with `launch.on_stream`, which makes the previous stream current again afterwards.
Importing this module starts nothing.

Per-stream state and snapshots: state.py. Prefill attention: prefill.py. The DeltaNet layer:
deltanet.py. Per-forward layout:

    meta        int32 [8, max_rows]: ids, pos, row_slot, row_tl, row_n, seg_slot, seg_row0,
                seg_rows -- written before each forward (or graph launch)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.base import Backend, Batch
from engine.backends.cuda.deltanet import DeltaNetMixin
from engine.backends.cuda.gemv import Pro
from engine.backends.cuda.modules import use_cache_dir
from engine.backends.cuda.prefill import prefill_attention
from engine.backends.cuda.scratch import RegionCarver
from engine.backends.cuda.state import StateMixin
from engine.backends.cuda.weights import DWeight, QWeight, upload
from engine.config import ModelConfig
from engine.errors import DeviceOutOfMemory
from engine.memory.scratch import decode_splits
from engine.memory.workspace import ATTN_QUERY_ROWS

META_ROWS = 8


class CudaBackend(StateMixin, DeltaNetMixin, Backend):
    name = "cuda"

    def __init__(
        self,
        settings: Any = None,
        dtype: str = "bfloat16",
        max_rows: int = 512,
        pool: Any = None,
    ):
        import cupy

        from engine.backends.cuda.ops import Ops
        from engine.memory import CupyPool

        use_cache_dir(getattr(settings, "cache_dir", None))
        self.ops = Ops(dtype, overlap=getattr(settings, "overlap_launches", True))
        self.dtype = dtype
        self.cp = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.use()
        # Every long-lived block (weights, state, scratch, workspace, saved prompts) comes
        # from this pool, which enforces the memory limit and reports what Snug holds.
        self.pool = pool or CupyPool(limit=getattr(settings, "limit_bytes", None))
        self.graphs: Any = None  # set by graphs.DecodeGraphs; torn down before buffers move
        self.scratch = RegionCarver("scratch", spill=("head",))
        self.workspace = RegionCarver("workspace", spill=("ws",))
        self.mem_scratch: Any = None  # engine.memory.Scratch, made by alloc_state
        self.mem_workspace: Any = None  # engine.memory.Workspace
        self.model: Any = None  # the forward the decode graphs capture (set at warm-up)
        self._state_block: Any = None
        self.capturing = False
        self.step_splits: int | None = None  # caps the decode attention's grid (graphs.py)
        self.config: ModelConfig | None = None
        self.arena: Any = None
        self.max_rows = max_rows
        self.slots = 0
        self.context = 0
        self.meta: Any = None
        self.meta_host: Any = None
        self.batch: Batch | None = None
        self.nvalid = 0
        self.counter: Any = None
        self.argmax_work: Any = None  # greedy picks split over blocks (Ops.argmax)
        self.picks: Any = None  # each decode row's next token (sample_rows)
        self.seen: Any = None  # per slot, a bitmap of the ids its reply has (presence penalty)
        self.draw_cand: Any = None  # the split draw's candidates (Ops.sample)
        # Invariant 7: when the plan has no room for an untied embedding table on the card,
        # it stays in host memory; each forward's rows are gathered on the host and copied
        # into `emb_rows` with the batch layout (so a captured graph reads them too).
        self.host_embeddings = False
        self.score_rows = ATTN_QUERY_ROWS  # prefill attention query rows (the plan's choice)
        self.host_table: Any = None
        self.emb_rows: Any = None
        self.emb_host: Any = None

    # ----- memory reports -----------------------------------------------------------------
    @property
    def act_itemsize(self) -> int:
        return self.ops.act_itemsize

    def held_bytes(self) -> int:
        """Bytes Snug holds on the card: the pool's blocks plus the small step buffers."""
        small = 0
        if self.meta is not None:
            small = self.meta.nbytes + self.counter.nbytes + self.argmax_work.nbytes
            small += self.picks.nbytes + self.seen.nbytes
            small += sum(a.nbytes for a in self.draw_cand)
        return self.pool.held_bytes + small

    def _teardown_graphs(self) -> None:
        if self.graphs is not None:
            self.graphs.teardown()

    def _attach_blocks(self, _rows: int = 0) -> None:
        """Point the carvers at the live scratch / workspace blocks (after a grow)."""
        ms, mw = self.mem_scratch, self.mem_workspace
        if ms is not None and ms.block is not None:
            self.scratch.attach(ms.block, ms.layout.regions)
        if mw is not None and mw.block is not None:
            self.workspace.attach(mw.block, {"ws": (0, mw.nbytes)})

    # ----- weights ------------------------------------------------------------------------
    def load_weights(self, checkpoint: Any, config: ModelConfig) -> dict[str, Any]:
        self.stream.use()
        self.config = config
        self.nvalid = config.vocab_size
        skip = ("embed_tokens",) if self.host_embeddings else ()
        if skip and config.tie_word_embeddings:
            raise ValueError("a tied embedding table is the LM head and must be on the card")
        try:
            weights, self.arena = upload(checkpoint, self.ops, self.pool, skip)
        except self.cp.cuda.memory.OutOfMemoryError as exc:
            raise DeviceOutOfMemory(
                f"{checkpoint.dir}: the weights do not fit on the GPU ({exc}); choose a smaller "
                "model or a 4-bit checkpoint"
            ) from exc
        if skip:
            self.host_table = checkpoint.read("embed_tokens")  # packed 4-bit stays packed
            weights["embed_tokens"] = None
        return weights

    def _alloc_meta(self, cap: int) -> None:
        self._teardown_graphs()
        self.meta = self.cp.zeros((META_ROWS, cap), self.cp.int32)
        mem = self.cp.cuda.alloc_pinned_memory(META_ROWS * cap * 4)
        self.meta_host = np.frombuffer(mem, np.int32, META_ROWS * cap).reshape(META_ROWS, cap)

    # ----- host transfer ------------------------------------------------------------------
    def to_host(self, x: Any) -> np.ndarray:
        if x.dtype == self.ops.act_dtype and self.dtype != "float32":
            out = self.cp.empty(x.shape, self.cp.float32)
            self.ops.to_f32(x, out)
            x = out
        return self.cp.asnumpy(x, stream=self.stream, blocking=True)

    def write_batch(self, batch: Batch, ids: np.ndarray) -> None:
        """Copy token ids and the row/segment layout into `meta` (asynchronously)."""
        R, S = batch.rows, len(batch.segments)
        if R > self.meta.shape[1]:
            self._alloc_meta(R)
        batch.check_context(self.context)
        self.stream.synchronize()  # the pinned buffer may still feed the last copy
        h = self.meta_host
        h[0, :R] = ids
        h[1, :R] = batch.positions()
        rows = np.array([s.rows for s in batch.segments], np.int32)
        row0 = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int32)
        h[2, :R] = np.repeat([s.slot for s in batch.segments], rows)
        h[3, :R] = np.arange(R, dtype=np.int32) - np.repeat(row0, rows)
        h[4, :R] = np.repeat(rows, rows)
        h[5, :S] = [s.slot for s in batch.segments]
        h[6, :S] = row0
        h[7, :S] = rows
        self.meta.data.copy_from_host_async(h.ctypes.data, h.nbytes, self.stream)
        if self.host_embeddings:
            self._host_embedding_rows(ids[:R])

    def prepare(self, batch: Batch, ids: np.ndarray) -> Any:
        self.stream.use()
        if not self.capturing:
            if self.mem_scratch is not None:
                # Lazy growth happens here, before any kernel of this forward runs: a failed
                # grow refuses this request and leaves every stream's state as it was.
                self.mem_scratch.ensure(min(batch.rows, self.mem_scratch.max_rows))
                if not batch.is_step:
                    self.mem_workspace.ensure(min(batch.rows, self.mem_workspace.max_rows))
            self.write_batch(batch, np.asarray(ids, np.int32))
            self.workspace.reset("ws")
        self.scratch.reset("r1")  # the embedding output is layer -1's
        self.batch = batch
        return self.meta[0, : batch.rows]

    def begin_layer(self, index: int) -> None:
        self.scratch.begin(f"r{index % 2}")

    def begin_head(self) -> None:
        self.scratch.begin("head")

    def _meta_rows(self, R: int) -> tuple[Any, Any, Any, Any]:
        m = self.meta
        return m[1, :R], m[2, :R], m[3, :R], m[4, :R]

    def _segs(self, S: int) -> tuple[Any, Any, Any]:
        m = self.meta
        return m[5, :S], m[6, :S], m[7, :S]

    def take(self, shape: tuple[int, ...], dtype: Any = None) -> Any:
        return self.scratch.take(shape, self.ops.act_dtype if dtype is None else dtype)

    # ----- ops ----------------------------------------------------------------------------
    def embedding(self, table: Any, ids: Any) -> Any:
        if table is None:  # host embeddings: rows were copied in by write_batch
            R = ids.shape[0]
            out = self.take((R, self.config.hidden_size))
            out[...] = self.emb_rows[:R]
            return out
        out = self.take((ids.shape[0], table.shape[1]))
        self.ops.embedding(table, ids, out)
        return out

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        out = self.take(x.shape)
        self.ops.rms_norm(x, weight, out, eps)
        return out

    def add_rms_norm(self, x: Any, delta: Any, weight: Any, eps: float) -> tuple[Any, Any]:
        out, h = self.take(x.shape), self.take(x.shape)
        self.ops.add_rms_norm(x, delta, weight, out, h, eps)
        return out, h

    def linear(self, x: Any, weight: Any) -> Any:
        out = self.take((x.shape[0], weight.shape[0]))
        self._linear_into(x, weight, out)
        return out

    def _one_product(self, rows: int, weights: list[Any]) -> Any:
        """The one weight that computes all of `weights` in a single launch: the weight
        itself, or at one row the stored group (weights.FUSED_GROUPS) they are parts of."""
        if len(weights) == 1:
            return weights[0]
        fused = getattr(weights[0], "fused", None)
        whole = (
            fused is not None
            and rows == 1
            and all(getattr(w, "fused", None) is fused for w in weights)
            and sum(w.shape[0] for w in weights) == fused.shape[0]
            and self.ops.gemv_ok(fused, 1)
        )
        return fused if whole else None

    @staticmethod
    def _parts(out: Any, weights: list[Any]) -> list[Any]:
        if len(weights) == 1:
            return [out]
        return [out[:, w.row0 : w.row0 + w.shape[0]] for w in weights]

    def linear_many(self, x: Any, weights: list[Any]) -> list[Any]:
        """A one-row step multiplies a stored group in one launch and hands out each part's
        slice of the output; anything else runs part by part."""
        product = self._one_product(x.shape[0], weights)
        if product is None or len(weights) == 1:
            return [self.linear(x, w) for w in weights]
        out = self.take((1, product.shape[0]))
        self.ops.gemv(x, product, out)
        return self._parts(out, weights)

    def norm_linear_many(
        self, x: Any, delta: Any, weight: Any, eps: float, weights: list[Any]
    ) -> tuple[list[Any], Any]:
        """Add, norm and projection in one gemv4 launch where it applies (`Ops.pro_ok`)."""
        product = self._one_product(x.shape[0], weights)
        if product is None or not self.ops.pro_ok(x, product, 1):
            return super().norm_linear_many(x, delta, weight, eps, weights)
        h = x if delta is None else self.take(x.shape)
        out = self.take((x.shape[0], product.shape[0]))
        pro = Pro(1, weight, eps, delta=delta, h=None if delta is None else h)
        self.ops.gemv(x, product, out, pro=pro)
        return self._parts(out, weights), h

    def norm_mlp(
        self, x: Any, delta: Any, weight: Any, eps: float, gate: Any, up: Any, down: Any
    ) -> tuple[Any, Any]:
        if type(gate) is not type(up) or not self.ops.pro_ok(x, gate, 1):
            return super().norm_mlp(x, delta, weight, eps, gate, up, down)
        h = self.take(x.shape)
        act = self.take((x.shape[0], gate.shape[0]))
        self.ops.gemv(x, gate, act, up=up, pro=Pro(1, weight, eps, delta=delta, h=h))
        return self.linear(act, down), h

    def _linear_into(self, x: Any, weight: Any, out: Any) -> None:
        if self.ops.gemv_ok(weight, x.shape[0]):
            self.ops.gemv(x, weight, out)
            return
        if isinstance(weight, QWeight):
            self.workspace.begin("ws")
            dense = self.workspace.take(weight.shape, self.ops.act_dtype)
            self.ops.dequant(weight, dense)
        else:
            dense = weight.data if isinstance(weight, DWeight) else weight
        self.ops.gemm(x, dense, out)

    def mlp(self, x: Any, gate: Any, up: Any, down: Any) -> Any:
        R = x.shape[0]
        h = self.take((R, gate.shape[0]))
        if type(gate) is type(up) and self.ops.gemv_ok(gate, R):
            self.ops.gemv(x, gate, h, up=up)
        else:
            g, u = self.linear(x, gate), self.linear(x, up)
            self.ops.swiglu(g, u, h)
        return self.linear(h, down)

    def take_rows(self, x: Any, rows: np.ndarray) -> Any:
        rows = np.asarray(rows, np.int32)
        if len(rows) == x.shape[0] and np.array_equal(rows, np.arange(len(rows))):
            return x
        out = self.take((len(rows), x.shape[1]))
        self.ops.gather_rows(x, self.cp.asarray(rows), out)
        return out

    def attention(
        self,
        layer: int,
        qg: Any,
        k: Any,
        v: Any,
        q_norm: Any,
        k_norm: Any,
        batch: Batch,
        ahead: tuple = (),
    ) -> Any:
        c = self.config
        R = qg.shape[0]
        Hq, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        heads = (Hq, Hkv, hd)
        kc, vc = self.kv_k[layer], self.kv_v[layer]
        q = self.take((R, Hq * hd))
        meta = self._meta_rows(R)
        self.ops.attn_prep(
            qg,
            k,
            v,
            q_norm,
            k_norm,
            meta,
            q,
            kc,
            vc,
            heads,
            c.rotary_dim,
            self.context,
            c.rope_theta,
            c.rms_norm_eps,
            ahead if batch.is_step else (),
        )
        out = self.take((R, Hq * hd))
        if batch.is_step:
            split, nsmax = decode_splits(self.context, self.step_splits)
            po = self.take((R, Hq, nsmax, hd), self.cp.float32)
            pml = self.take((R, Hq, nsmax, 2), self.cp.float32)
            self.ops.attn_decode(
                q, kc, vc, meta[0], meta[1], po, pml, heads, self.context, split, nsmax
            )
            self.ops.attn_combine(po, pml, qg, meta[0], out, heads, split, nsmax)
            return out
        row0 = 0
        for seg in batch.segments:
            prefill_attention(self, q, qg, kc, vc, seg, row0, out)
            row0 += seg.rows
        return out

    # ----- lifetime -----------------------------------------------------------------------
    def warm_up(self, model: Any, eager: bool) -> None:
        """Compile every kernel a request will use and, when the whole scratch fits
        (`eager`), allocate scratch and workspace at max rows and capture the decode graph
        of every batch size up to the stream count, so no request pays for an allocation or
        a capture (invariant 4). Runs on the hidden spare slot; live streams are untouched."""
        from engine.backends.cuda.graphs import TUNE_BUDGET_S, TUNE_MAX_STEP_S

        self.model = model
        graphs = self._decode_graphs()
        if eager:
            self.mem_scratch.ensure(self.mem_scratch.max_rows)
            self.mem_workspace.ensure(self.mem_workspace.max_rows)
        rows = min(self.max_rows, self.context, 64 if not eager else self.max_rows)
        model.forward(Batch.window(0, 0, rows), np.zeros(rows, np.int32))
        for batch_size in range(1, self.slots + 1):
            graphs.warm(batch_size)  # compiles and tunes the step kernels for this size
            if eager:
                graphs.capture(batch_size)
        step = tuple(graphs.keys.get(1, ()))
        if eager and self.ops.tune_in_step and step not in self.ops.step_tuned:
            graphs.tune(1, max_step_s=TUNE_MAX_STEP_S, budget_s=TUNE_BUDGET_S)
            self.ops.step_tuned.add(step)  # later loads of these shapes keep the choices
        for slot in range(self.slots):
            self.reset_slot(slot)
        self.stream.synchronize()

    def decode_step(self, batch: Batch, ids: np.ndarray) -> tuple[Any, Any]:
        """One decode row per stream through the captured graph (captured on first use);
        returns (logits [B, V], greedy tokens [B] int32) on the device."""
        return self._decode_graphs().replay(batch, ids)

    @property
    def steps_read_picks(self) -> bool:
        """Whether a step can take its input ids from the previous step's picks on the
        device (`launch_step` with no batch): not where embedding rows are gathered on the
        host from ids the host must know first (invariant 7)."""
        return not self.host_embeddings

    def launch_step(self, batch: Batch | None, ids: Any, rows: list) -> Any:
        """A decode step that does not wait (`DecodeGraphs.launch`; batch None: the step
        after the last one, fed by its picks on the device)."""
        return self._decode_graphs().launch(batch, ids, rows)

    def _decode_graphs(self) -> Any:
        """The model's DecodeGraphs, made on first use (it registers itself as self.graphs)."""
        from engine.backends.cuda.graphs import DecodeGraphs

        return self.graphs or DecodeGraphs(self, self.model)

    def release(self) -> None:
        """Free graphs, scratch, workspace, state and weights (unload)."""
        self._teardown_graphs()
        self.graphs = None
        for mem in (self.mem_scratch, self.mem_workspace):
            if mem is not None:
                mem.release()
        self.scratch.detach()
        self.workspace.detach()
        for block in (self._state_block, getattr(self.arena, "alloc", None)):
            if block is not None:
                block.free()
        self._state_block = self.arena = None
        self.stream.synchronize()

    # ----- sampling on the device ---------------------------------------------------------
    def sample_greedy(self, logits: Any, out: Any = None) -> Any:
        """argmax over the real vocabulary of each row, int32 on the device."""
        if out is None:
            out = self.take((logits.shape[0],), self.cp.int32)
        self.ops.argmax(logits, min(self.nvalid, logits.shape[1]), out, self.argmax_work)
        return out

    def sample_rows(self, logits: Any, greedy: Any, rows: list, in_place: bool = False) -> Any:
        """The next token of each row of a decode step, on the device: rows[i] None takes
        greedy[i] (the step's argmax), else the `engine.sampling.Draw` draws from logits[i]
        (with a presence penalty, the slot's bitmap of seen ids updated first). Returns int32
        [len(rows)] on the device: greedy itself where in_place (the draws overwrite their
        rows; no copies), else a copy."""
        picks = greedy[: len(rows)] if in_place else self.picks[: len(rows)]
        if not in_place:
            picks[...] = greedy[: len(rows)]
        for i, d in enumerate(rows):
            if d is None:
                continue
            seen = None
            if d.penalty:
                seen = self.seen[d.slot]
                if d.clear or d.mark:
                    ids = self.cp.asarray(np.asarray(d.mark, np.int32)) if d.mark else None
                    self.ops.mark_seen(seen, ids, d.clear)
            self.ops.sample(
                logits[i : i + 1],
                min(self.nvalid, logits.shape[1]),
                d.top_k,
                d.top_p,
                d.temperature,
                d.seed,
                None,  # every draw is seeded: nothing carried between calls
                picks[i : i + 1],
                seen,
                d.penalty,
                self.draw_cand,
            )
        return picks

    def sample(
        self, logits: Any, temperature: float, top_k: int, top_p: float, seed: int, out: Any = None
    ) -> Any:
        """top-k (at most 1024; 0 means 1024) then top-p sampling at `temperature`."""
        if temperature <= 0:
            return self.sample_greedy(logits, out)
        if out is None:
            out = self.take((logits.shape[0],), self.cp.int32)
        k = 1024 if top_k <= 0 else min(top_k, 1024)
        self.ops.sample(
            logits,
            min(self.nvalid, logits.shape[1]),
            k,
            top_p,
            temperature,
            seed,
            self.counter,
            out,
            cand=self.draw_cand,
        )
        return out
