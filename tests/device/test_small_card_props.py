"""The whole forward on this GPU read as a small card: 20 SMs, 2 MiB of L2 and 99 KiB of
shared memory a block (an RTX 3050's numbers; SNUG_DEVICE_PROPS, launch.simulate). The
compute capability stays this GPU's, so its gates (the DeltaNet step over a cluster, the L2
prefetch) stay on and their geometry is what the small numbers give.

Each run is a child process (the properties and the projections' tuned choices are the
process's), which loads the 4B shape (MLX 4-bit, random weights) through `Engine.load` and
replies greedily, and records every distinct launch of the load and the reply: kernel,
grid, block, shared bytes, the L2 spans of the step's DeltaNet and attention launches, the
grid cap of each tensor-core projection. In fp32 (tokens compare exactly) the small card
gives the real card's tokens; in both fp32 and bf16 (the tensor-core projections) every
launch is the choice the backend's functions make for the small card: 32-row DeltaNet
chunks, shared memory within 99 KiB, grids capped at 20 SMs, spans within half of 2 MiB,
attention warps for 20 SMs.

Where the driver has green contexts (CUDA 12.4 and newer), one more run holds about 20 SMs
of the GPU (as many as the driver grants) and reads the card as that many: the same tokens.
Skipped, with the driver's answer, where it has none.

    pytest -s tests/device/test_small_card_props.py
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.backends.cuda.attention import decode_kernel
from engine.backends.cuda.deltanet import chunk_kernel, chunk_rows_for
from engine.backends.cuda.gemv_plan import gemv4_static_smem
from engine.backends.cuda.tuning import Tuning
from engine.config import parse_device_props

SMALL = "sms=20,l2_mb=2,smem_kb=99"
SHAPE, CONTEXT, MAX_ROWS, STREAMS, PROMPT, NEW = "4B", 1024, 256, 2, 100, 16
ROOT = Path(__file__).resolve().parents[2]


# ----- the child ------------------------------------------------------------------------------
def record_launches(out: set) -> None:
    """Every launch from now on adds (kernel, grid, block, shared bytes, L2 span bytes of a
    step's DeltaNet or attention launch, grid cap of a tensor-core projection) to `out`."""
    from engine.backends.cuda import launch, projections

    names: dict[int, str] = {}
    caps: dict[tuple, int] = {}
    fn, gemv4, resident, run = (
        launch.Kernels.fn,
        projections.Projections.gemv4_kernel,
        projections.Projections._gemv4_resident,
        launch.Kernels.launch,
    )

    def named_fn(self, file, symbol):
        f = fn(self, file, symbol)
        names[id(f)] = symbol
        return f

    def named_gemv4(self, R, swiglu, v, kind=0):
        f = gemv4(self, R, swiglu, v, kind)
        names[id(f)] = self.gemv4_symbol(R, swiglu, v, kind)
        return f

    def counted_resident(self, f, threads, smem):
        n = resident(self, f, threads, smem)
        caps[(id(f), threads, smem)] = n
        return n

    def recorded(self, f, grid, block, args, shared_mem=0):
        sym = names.get(id(f), "?")
        spans = (
            [int(a) for a in args[-6:]][1::2] if sym.startswith(("gdn_step", "attn_prep")) else []
        )
        cap = caps.get((id(f), int(block[0]), int(shared_mem)), 0)
        g, b = tuple(int(x) for x in grid), tuple(int(x) for x in block)
        out.add((sym, g, b, int(shared_mem), tuple(spans), cap))
        run(self, f, grid, block, args, shared_mem)

    launch.Kernels.fn = named_fn
    projections.Projections.gemv4_kernel = named_gemv4
    projections.Projections._gemv4_resident = counted_resident
    launch.Kernels.launch = recorded


def _driver(name: str, *args) -> None:
    from engine.backends.cuda.launch import driver_function

    f = driver_function(name)
    if f is None:
        raise RuntimeError(f"the driver has no {name}")
    rc = f(*args)
    if rc:
        raise RuntimeError(f"{name} returned CUresult {rc}")


# CUdevResource (cuda.h, 12.4): its type, 92 bytes, then the SM resource (smCount first);
# 256 bytes hold any release's layout.
_RESOURCE, _SM_TYPE, _SM_COUNT = 256, 1, 96


def _sm_count(resource) -> int:
    return int.from_bytes(bytes(resource[_SM_COUNT : _SM_COUNT + 4]), "little")


def green_context(sms: int) -> tuple[int, int]:
    """Make a green context of at least `sms` SMs current on this thread, before CuPy
    starts; returns (its context handle, the SMs the driver granted)."""
    _driver("cuInit", ctypes.c_uint(0))
    dev = ctypes.c_int()
    _driver("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(0))
    whole, part = (ctypes.c_ubyte * _RESOURCE)(), (ctypes.c_ubyte * _RESOURCE)()
    _driver("cuDeviceGetDevResource", dev, whole, ctypes.c_int(_SM_TYPE))
    groups = ctypes.c_uint(1)
    _driver(
        "cuDevSmResourceSplitByCount",
        part,
        ctypes.byref(groups),
        whole,
        None,
        ctypes.c_uint(0),
        ctypes.c_uint(sms),
    )
    desc, green, ctx = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    _driver("cuDevResourceGenerateDesc", ctypes.byref(desc), part, ctypes.c_uint(1))
    _driver("cuGreenCtxCreate", ctypes.byref(green), desc, dev, ctypes.c_uint(1))  # its stream
    _driver("cuCtxFromGreenCtx", ctypes.byref(ctx), green)
    _driver("cuCtxSetCurrent", ctx)
    return int(ctx.value), _sm_count(part)


def current_context_sms() -> tuple[int, int]:
    """(the current context's handle, the SMs it holds)."""
    ctx, res = ctypes.c_void_p(), (ctypes.c_ubyte * _RESOURCE)()
    _driver("cuCtxGetCurrent", ctypes.byref(ctx))
    _driver("cuCtxGetDevResource", ctx, res, ctypes.c_int(_SM_TYPE))
    return int(ctx.value or 0), _sm_count(res)


def child(path: str, dtype: str, green: int) -> dict:
    """Load and reply as the module docstring says; the result as a dict."""
    from engine.config import EngineSettings
    from engine.session import Engine, GenerationParams

    result: dict = {}
    if green:
        try:
            ctx, granted = green_context(green)
        except RuntimeError as exc:
            return {"green_unavailable": str(exc)}
        os.environ["SNUG_DEVICE_PROPS"] = f"sms={granted},l2_mb=2,smem_kb=99"
        result["green"] = {"granted": granted}
    launches: set = set()
    record_launches(launches)
    settings = replace(EngineSettings.from_env(), backend="cuda", compute_dtype=dtype)
    engine = Engine.load(path, settings, context=CONTEXT, streams=STREAMS, max_rows=MAX_ROWS)
    engine.eos_ids = frozenset()  # random weights: every reply runs its NEW tokens
    ids = np.random.default_rng(5).integers(0, 400, PROMPT).tolist()
    params = GenerationParams(max_new_tokens=NEW, greedy=True)
    tokens = [e.token_id for e in engine.generate(ids, params)]
    be, c = engine.backend, engine.config
    kern = be.deltanet.chunk_kernel()  # fp32: gdn_chunk; 16-bit: gdn_chunk_tc
    if green:
        now, sms = current_context_sms()
        result["green"].update(current=now == ctx, sms=sms)
    result.update(
        card=[be.card.capability, be.card.sm_count, be.card.l2_bytes, be.card.smem_per_block],
        chunk_rows=be.deltanet.chunk_rows(),
        chunk=[kern.symbol, kern.smem, dtype],
        heads=[c.num_attention_heads, c.num_key_value_heads, c.head_dim],
        invariant=bool(getattr(be.attn, "batch_invariant", False)),
        prefetch=bool(be.kernels.prefetch),
        tokens=tokens,
        launches=sorted(launches),
    )
    engine.unload()
    return result


# ----- the parent -----------------------------------------------------------------------------
def run_child(path: Path, dtype: str, props: str = "", green: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SNUG_DEVICE_PROPS"}
    if props:
        env["SNUG_DEVICE_PROPS"] = props
    cmd = [sys.executable, "-m", "tests.device.test_small_card_props", str(path), dtype]
    done = subprocess.run(
        [*cmd, str(green)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-6000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def shape_dir(tmp_path_factory):
    from engine.testing.synth import model_dir

    return model_dir(tmp_path_factory.mktemp("small-card"), SHAPE, "mlx4", seed=2)


@pytest.fixture(scope="module")
def real_fp32(shape_dir):
    return run_child(shape_dir, "float32")


def check_small_card_choices(run: dict, sms: int) -> None:
    """Every launch of `run` is the small card's choice (module docstring)."""
    cc, n_sm, l2, smem = run["card"]
    limit = parse_device_props(SMALL)["smem_per_block"]
    assert (n_sm, l2, smem) == (sms, 2 << 20, limit)
    assert run["chunk_rows"] == chunk_rows_for(limit) == 32
    Hq, Hkv, hd = run["heads"]
    span_cap = int(l2 * Tuning().l2_span_share) & ~15
    launches = [tuple(x) for x in run["launches"]]
    syms = {x[0] for x in launches}
    assert "?" not in syms, "a launch the recorder could not name"
    symbol, smem, dtype = run["chunk"]  # fp32: gdn_chunk; bf16: the tensor-core gdn_chunk_tc
    want = chunk_kernel(dtype, cc, limit)
    assert (symbol, smem) == (want.symbol, want.smem) and smem <= limit
    assert {s for s in syms if s.startswith("gdn_chunk")} == {symbol}
    spans = []
    for sym, grid, block, shared, span, cap in launches:
        assert shared <= limit and 0 < block[0] <= 1024, (sym, block, shared)
        if sym.startswith("gdn_chunk"):
            assert shared == smem
        if sym.startswith("gemv4<"):
            kind = int(sym[len("gemv4<") : -1].split(",")[6])
            assert shared + gemv4_static_smem(kind) <= limit, sym
            assert cap > 0 and cap % sms == 0 and grid[0] <= cap, (sym, grid, cap)
        if sym.startswith(("gemv<", "swiglu", "to_f32", "from_")):
            assert grid[0] <= 16 * sms, (sym, grid)  # launch.grid_cap
        if sym.startswith("dequant<"):
            assert grid[0] <= 4 * 16 * sms, (sym, grid)
        if sym.startswith(("attn_decode<", "attn_decode_q8<")):
            q8 = sym.startswith("attn_decode_q8")
            want = decode_kernel(Hq // Hkv, hd, *grid, sms, invariant=run["invariant"], q8=q8)
            assert sym == want[0], (sym, grid, want)
        spans += span
    assert all(s <= span_cap for s in spans), (max(spans), span_cap)
    if run["prefetch"]:  # the 4B's out_proj is more than half of 2 MiB: brought capped
        assert span_cap in spans
    else:
        assert not any(spans)


def test_fp32_forward_on_a_20_sm_2mb_99kb_card_gives_the_same_tokens(shape_dir, real_fp32):
    small = run_child(shape_dir, "float32", SMALL)
    check_small_card_choices(small, 20)
    real = real_fp32
    assert real["card"][1] != 20 and real["chunk_rows"] == chunk_rows_for(real["card"][3])
    print(f"\n[small card] fp32 tokens {small['tokens']}")
    print(f"[small card] {len(small['launches'])} distinct launches, real {len(real['launches'])}")
    assert len(small["tokens"]) == NEW
    assert small["tokens"] == real["tokens"]


def test_bf16_tensor_core_choices_fit_a_99kb_card(shape_dir):
    small = run_child(shape_dir, "bfloat16", SMALL)
    check_small_card_choices(small, 20)
    gemv4 = [x for x in small["launches"] if x[0].startswith("gemv4<")]
    rows = {int(x[0][len("gemv4<") :].split(",")[0]) for x in gemv4}
    assert rows == set(range(1, 9)), rows  # the decode steps and every decode-sized window
    print(f"\n[small card] bf16 tokens {small['tokens']}; {len(gemv4)} gemv4 launch shapes")
    assert len(small["tokens"]) == NEW


def test_a_green_context_of_20_sms_gives_the_same_tokens(shape_dir, real_fp32):
    run = run_child(shape_dir, "float32", green=20)
    if "green_unavailable" in run:
        pytest.skip(f"no green context here: {run['green_unavailable']}")
    green = run["green"]
    print(f"\n[green context] {green}")
    if not green["current"]:
        pytest.skip("the CUDA runtime left the green context for the primary one")
    assert green["sms"] == green["granted"] >= 20
    check_small_card_choices(run, green["granted"])
    assert run["tokens"] == real_fp32["tokens"]


if __name__ == "__main__":
    print(json.dumps(child(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
