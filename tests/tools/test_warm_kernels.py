"""tools/compile_kernels.py warm: which gemv4 modules it compiles, and in what order (no GPU)."""

from __future__ import annotations

from engine.backends.cuda.projections import GEMV4_VARIANTS, Projections
from tools.compile_kernels import module_keys


def test_modules_are_the_ones_a_decode_step_and_the_tests_build():
    keys = module_keys(["float16", "bfloat16"], [8, 1])
    # the benchmarks' modules (one bf16 row) first
    assert {k[:2] for k in keys[:5]} == {("bfloat16", 1)}
    # the gated norm as each type runs it, never with SwiGLU (it precedes out_proj only)
    assert {k[3] for k in keys if k[0] == "bfloat16"} == {0, 1, 5}
    assert {k[3] for k in keys if k[0] == "float16"} == {0, 1, 2}
    assert not [k for k in keys if k[2] and k[3] not in (0, 1)]
    assert len(keys) == len(set(keys)) == 2 * 2 * 5
    for _dtype, rows, swiglu, kind in keys:  # each names a module's kernels
        assert Projections.gemv4_symbol(rows, swiglu, GEMV4_VARIANTS[0], kind).startswith(
            f"gemv4<{rows},"
        )
