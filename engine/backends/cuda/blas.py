"""Row-major matrix products through cuBLAS `gemmEx` / `gemmStridedBatchedEx` (fp32 compute).

Shapes are row-major; cuBLAS is column-major, so `C = A @ B` is issued as `C^T = B^T A^T`.
Inputs and outputs are raw device pointers with their CUDA data types, which lets bf16
arrays (stored as uint16) and fp32 score outputs share one path.

Every product goes through one cuBLAS handle a device for the whole process (`handle`), not
CuPy's, which is one a thread: warm-up's prompt makes it, and a request served on another
thread (the server's scheduler, the app's worker) makes none. The engine runs its GPU work
on one thread at a time, and each product sets the handle's stream first.
"""

from __future__ import annotations

import numpy as np

CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
COMPUTE_32F = 68
OP_N, OP_T = 0, 1
GEMM_DEFAULT = -1
TYPES = {"float32": CUDA_R_32F, "float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF}

_ALPHA_BETA: dict[float, tuple[np.ndarray, int]] = {}  # value -> (its array, its address)
_HANDLES: dict[int, int] = {}  # device id -> the process's cuBLAS handle on it


def _scalar(v: float) -> int:
    """The host address of an fp32 `v` that lives as long as the process (an array's
    `ctypes.data` makes a ctypes object on each read: kept with it instead)."""
    held = _ALPHA_BETA.get(v)
    if held is None:
        arr = np.array([v], dtype=np.float32)
        held = _ALPHA_BETA[v] = (arr, arr.ctypes.data)
    return held[1]


def handles() -> dict[int, int]:
    """The cuBLAS handles made so far: device id -> handle (at most one a device)."""
    return dict(_HANDLES)


def handle() -> int:
    """The current device's cuBLAS handle, made on first use (on any thread)."""
    import cupy

    dev = cupy.cuda.Device().id
    h = _HANDLES.get(dev)
    if h is None:
        h = _HANDLES[dev] = _create()
    return h


def _create() -> int:
    from cupy_backends.cuda.libs import cublas

    return cublas.create()


def _handle():
    import cupy
    from cupy_backends.cuda.libs import cublas

    h = handle()
    cublas.setStream(h, cupy.cuda.get_current_stream().ptr)
    return h, cublas


def matmul(
    a: int,
    a_type: int,
    lda: int,
    b: int,
    b_type: int,
    ldb: int,
    b_transposed: bool,
    c: int,
    c_type: int,
    ldc: int,
    m: int,
    n: int,
    k: int,
    alpha: float = 1.0,
    batch: int = 1,
    stride_a: int = 0,
    stride_b: int = 0,
    stride_c: int = 0,
) -> None:
    """C[m, n] = alpha * A[m, k] @ (B[k, n] or Bt[n, k].T), row-major, optionally batched.

    Pointers are device addresses; strides are in elements. With `b_transposed` the second
    operand is stored as [n, k] (a weight `[out, in]`, or keys `[L, hd]`).
    """
    h, cublas = _handle()
    op_a = OP_T if b_transposed else OP_N
    if batch == 1:
        cublas.gemmEx(
            h,
            op_a,
            OP_N,
            n,
            m,
            k,
            _scalar(alpha),
            b,
            b_type,
            ldb,
            a,
            a_type,
            lda,
            _scalar(0.0),
            c,
            c_type,
            ldc,
            COMPUTE_32F,
            GEMM_DEFAULT,
        )
    else:
        cublas.gemmStridedBatchedEx(
            h,
            op_a,
            OP_N,
            n,
            m,
            k,
            _scalar(alpha),
            b,
            b_type,
            ldb,
            stride_b,
            a,
            a_type,
            lda,
            stride_a,
            _scalar(0.0),
            c,
            c_type,
            ldc,
            stride_c,
            batch,
            COMPUTE_32F,
            GEMM_DEFAULT,
        )
