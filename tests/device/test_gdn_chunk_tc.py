"""The chunked delta rule on tensor cores (`gdn_chunk_tc`, gdn_chunk_tc.cu) against the
numpy reference (engine/backends/gdn.py) and the fp32 SIMT kernel (`gdn_chunk`), on the same
fp32 inputs at the 4B's head sizes (16 key heads, 32 value heads, 128 x 128): one 512-row
segment, two segments of different lengths (77 rows: not a multiple of a chunk), and a one-row
segment next to a chunk plus one row; at the 32 rows a chunk the backend runs it with
(deltanet.TC_ROWS) and at 64, which the template also takes. Run with -s for the timing line:
ms a launch at 512 rows, tensor cores at both chunk sizes and SIMT.

TOL: TF32 keeps 11 significant bits (unit roundoff 2^-11 = 4.9e-4) of every operand of a
product and sums in fp32, and the state stays fp32. These inputs come out at 4e-4 relative
Frobenius error on the output and 3e-4 on the state, 7e-4 on the largest element, on an H200
and in a numpy emulation of the kernel's roundings alike, whatever the decay; the bounds leave
4 (Frobenius) and 10 (largest element) units of roundoff.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.gdn import chunked as reference

TOL = 2e-3  # relative Frobenius error
TOL_MAX = 5e-3  # largest elementwise difference over the largest reference element
HK, HV, D = 16, 32, 128  # the 4B's DeltaNet heads (key and value head dims both 128)
CASES = {"one 512-row segment": [512], "192 and 77 rows": [192, 77], "1 and 65 rows": [1, 65]}


def _backend(dtype: str):
    from engine.backends.cuda.backend import CudaBackend

    return CudaBackend(dtype=dtype)


def _tc_rows_or_skip(rows: int) -> None:
    from engine.backends.cuda.deltanet import chunk_tc_smem
    from engine.backends.cuda.launch import compute_capability, smem_per_block

    if compute_capability() < 80:
        pytest.skip("TF32 mma needs sm_80")
    if chunk_tc_smem(rows) > smem_per_block():
        pytest.skip(f"this GPU gives a block {smem_per_block()} bytes of shared memory")


def _inputs(rows: list[int], seed: int) -> dict:
    """q, k (l2-normalized, q scaled 1/sqrt(dk)), v, g, beta as gdn_prep leaves them, and a
    state for each segment's slot (slots in reverse order of the segments)."""
    rng = np.random.default_rng(seed)
    R, S = sum(rows), len(rows)
    q = rng.standard_normal((R, HK, D)).astype(np.float32)
    k = rng.standard_normal((R, HK, D)).astype(np.float32)
    q /= np.linalg.norm(q, axis=2, keepdims=True) * np.sqrt(D)
    k /= np.linalg.norm(k, axis=2, keepdims=True)
    return {
        "q": q,
        "k": k,
        "v": rng.standard_normal((R, HV * D)).astype(np.float32),
        "g": -rng.uniform(0.0, 0.3, (R, HV)).astype(np.float32),  # the state lasts chunks
        "beta": rng.uniform(0, 1, (R, HV)).astype(np.float32),
        "state": (0.1 * rng.standard_normal((S, HV, D, D))).astype(
            np.float32
        ),  # [slot, Hv, dv, dk]
        "slots": list(range(S))[::-1],
        "row0": np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int32),
        "rows": rows,
    }


def _device(x: dict) -> tuple:
    """(q, k, v, g, beta, state, segs) on the device: the kernel's arguments."""
    import cupy

    R = sum(x["rows"])
    dev = [cupy.asarray(x[n].reshape(R, -1)) for n in ("q", "k", "v", "g", "beta")]
    segs = [cupy.asarray(a, dtype=cupy.int32) for a in (x["slots"], x["row0"], x["rows"])]
    return (*dev, cupy.asarray(x["state"]), segs)


def _chunk(be, x: dict, tc_rows: int | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """o [R, Hv*dv] and the state after one launch of `be`'s chunked delta rule (on
    gdn_chunk_tc at `tc_rows` a chunk where given), and the instance that ran."""
    import cupy

    if tc_rows is not None:
        be.deltanet._tc_rows = tc_rows
    q, k, v, g, beta, state, segs = _device(x)
    o = cupy.full((q.shape[0], HV * D), cupy.nan, cupy.float32)
    assert be.deltanet.chunk(q, k, v, g, beta, state, segs, len(x["rows"]), o, HK, HV, D)
    return cupy.asnumpy(o), cupy.asnumpy(state), be.deltanet.chunk_kernel().symbol


def _errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(relative Frobenius error, largest difference over the largest element)."""
    diff = got.astype(np.float64) - want
    return (
        float(np.linalg.norm(diff) / np.linalg.norm(want)),
        float(np.abs(diff).max() / np.abs(want).max()),
    )


@pytest.mark.parametrize("tc_rows", [64, 32])
@pytest.mark.parametrize("case", list(CASES))
def test_tensor_core_chunks_match_numpy_and_the_fp32_kernel(tc_rows, case):
    _tc_rows_or_skip(tc_rows)
    rows = CASES[case]
    x = _inputs(rows, seed=len(case) + tc_rows)
    o_tc, s_tc, sym = _chunk(_backend("bfloat16"), x, tc_rows)
    assert sym == f"gdn_chunk_tc<{tc_rows}>"
    o_simt, s_simt, sym = _chunk(_backend("float32"), x)
    assert sym.startswith("gdn_chunk<")

    rep = HV // HK
    for seg, slot in enumerate(x["slots"]):
        r = slice(x["row0"][seg], x["row0"][seg] + rows[seg])
        st = x["state"][slot].transpose(0, 2, 1).astype(np.float64)  # [Hv, dk, dv]
        want = reference(
            np.repeat(x["q"][r], rep, axis=1),
            np.repeat(x["k"][r], rep, axis=1),
            x["v"][r].reshape(-1, HV, D),
            x["g"][r],
            x["beta"][r],
            st,
        )
        checks = {
            "o vs numpy": (o_tc[r].reshape(-1, HV, D), want),
            "state vs numpy": (s_tc[slot].transpose(0, 2, 1), st),
            "o vs gdn_chunk": (o_tc[r], o_simt[r].astype(np.float64)),
            "state vs gdn_chunk": (s_tc[slot], s_simt[slot].astype(np.float64)),
        }
        for name, (got, ref) in checks.items():
            fro, top = _errors(got, ref)
            print(
                f"\n[gdn_chunk_tc<{tc_rows}> {case}, segment {seg}] {name}: {fro:.2e} ({top:.2e})"
            )
            assert fro < TOL and top < TOL_MAX, (name, seg, fro, top)


def test_tensor_core_chunks_are_timed_against_the_simt_kernel():
    """ms a launch at 512 rows of the 4B's heads (one layer of a 512-row window), best of
    20: gdn_chunk_tc at each chunk size that fits, and gdn_chunk at the GPU's."""
    import cupy

    _tc_rows_or_skip(32)
    from engine.backends.cuda.deltanet import chunk_tc_smem
    from engine.backends.cuda.launch import smem_per_block

    x = _inputs([512], seed=5)
    q, k, v, g, beta, state, segs = _device(x)
    o = cupy.empty((512, HV * D), cupy.float32)
    runs = [(_backend("float32"), None)]
    runs += [(_backend("bfloat16"), gc) for gc in (64, 32) if chunk_tc_smem(gc) <= smem_per_block()]
    times = {}
    for be, gc in runs:
        if gc is not None:
            be.deltanet._tc_rows = gc
        sym = be.deltanet.chunk_kernel().symbol
        best = float("inf")
        for i in range(23):  # the first launches compile and warm up
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record()
            assert be.deltanet.chunk(q, k, v, g, beta, state, segs, 1, o, HK, HV, D)
            e1.record()
            e1.synchronize()
            if i >= 3:
                best = min(best, cupy.cuda.get_elapsed_time(e0, e1))
        times[sym] = best
    simt = next(t for s, t in times.items() if s.startswith("gdn_chunk<"))
    line = ", ".join(f"{s} {t:.3f} ms ({simt / t:.1f}x)" for s, t in times.items())
    print(f"\n[chunked delta rule, 4B heads, 512 rows] {line}")
    assert all(np.isfinite(t) for t in times.values())
