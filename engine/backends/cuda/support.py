"""What the CUDA kernels cover, checked at load before anything is allocated: the card (its
compute capability, bf16, the NVRTC that compiles for it) and the model's shape. Each check
is a pure function returning the reason it refuses (None: covered); `check_card` and
`check_model` raise it as `UnsupportedModel`, whose message names the key and value at
fault and points to the numpy backend, which runs any shape.
"""

from __future__ import annotations

from engine.backends.cuda.attention import MAX_GROUP, STATIC_SMEM, decode_held, decode_smem
from engine.backends.cuda.card import MIN_CAPABILITY, nvrtc_needed, runs_bf16
from engine.config import ENV_BACKEND, ENV_DTYPE
from engine.errors import UnsupportedModel
from engine.model_config import ModelConfig

NUMPY = f"use the numpy backend ({ENV_BACKEND}=numpy or --backend numpy)"
DECODE_WARPS = 4  # the fewest warps attn_decode runs with (its static shared memory)


def _cc(capability: int) -> str:
    return f"{capability // 10}.{capability % 10}"


def card_refusal(capability: int, dtype: str) -> str | None:
    """Why the kernels cannot run on a card of this compute capability in `dtype`."""
    if capability < MIN_CAPABILITY:
        return (
            f"compute capability {_cc(capability)}: the CUDA kernels are built and tested for "
            f"{_cc(MIN_CAPABILITY)} (Turing) and newer; {NUMPY}"
        )
    if dtype == "bfloat16" and not runs_bf16(capability):
        return (
            f"compute dtype bfloat16 on compute capability {_cc(capability)}: bf16 needs 8.0 "
            f"(Ampere) or newer; set {ENV_DTYPE}=float16, or {NUMPY}"
        )
    return None


def nvrtc_refusal(
    capability: int, version: tuple[int, int], supported: tuple[int, ...] = ()
) -> str | None:
    """Why the loaded NVRTC (`version`, compiling for the `supported` capabilities) cannot
    compile the kernels for this card: card.NVRTC_NEEDED where it knows the architecture,
    else an architecture NVRTC lists of the card's major and no newer minor. An older NVRTC
    makes CuPy compile for the newest architecture it knows: machine code the card cannot
    load, or (sm_90 before 12.0) a PTX instruction NVRTC does not know."""
    needed = nvrtc_needed(capability)
    if needed is not None:
        ok = tuple(version) >= needed
    else:  # machine code of an older minor of the same major loads: sm_120's on sm_121
        major = capability // 10
        ok = not supported or any(a // 10 == major and a <= capability for a in supported)
    if ok:
        return None
    if needed is not None:
        fix = (
            f"it needs NVRTC {needed[0]}.{needed[1]} or newer: pip install "
            f"'nvidia-cuda-nvrtc-cu12>={needed[0]}.{needed[1]}' (CuPy 14 and newer load it)"
        )
    else:
        fix = "install an NVRTC release that lists it"
    return (
        f"NVRTC {version[0]}.{version[1]} cannot compile the CUDA kernels for compute "
        f"capability {_cc(capability)} (sm_{capability}): {fix}; or {NUMPY}"
    )


def model_refusal(config: ModelConfig) -> str | None:
    """Why the kernels do not cover this model's shape: the first config key at fault."""
    c = config
    hd, group = c.head_dim, c.num_attention_heads // c.num_key_value_heads
    checks = (
        (
            "linear_key_head_dim",
            c.linear_key_head_dim,
            c.linear_key_head_dim == 128,
            "the DeltaNet kernels (gdn.cu, gdn_chunk.cu) take key heads of 128",
        ),
        (
            "linear_value_head_dim",
            c.linear_value_head_dim,
            c.linear_value_head_dim % 4 == 0 and c.linear_value_head_dim <= 512,
            "gdn_prep stages at most 512 channels a head and gdn_scan takes 4 value columns "
            "a warp: a multiple of 4 up to 512",
        ),
        (
            "linear_num_value_heads",
            c.linear_num_value_heads,
            c.value_dim % 16 == 0,
            "gdn_scan's blocks take 16 value columns: heads x linear_value_head_dim must be "
            "a multiple of 16",
        ),
        (
            "linear_conv_kernel_dim",
            c.linear_conv_kernel_dim,
            c.linear_conv_kernel_dim >= 2,
            "the conv state keeps kernel - 1 taps: at least 2",
        ),
        (
            "head_dim",
            hd,
            hd % 32 == 0,
            "the attention kernels give each lane of a warp head_dim / 32 values",
        ),
        (
            "num_attention_heads",
            c.num_attention_heads,
            group <= MAX_GROUP,
            f"attn_decode holds at most {MAX_GROUP} query heads a KV head "
            f"(num_key_value_heads = {c.num_key_value_heads})",
        ),
        (
            "head_dim",
            hd,
            decode_smem(decode_held(group)[0], hd, DECODE_WARPS) <= STATIC_SMEM,
            "attn_decode's partial outputs of that width overflow 48 KiB of static shared memory",
        ),
    )
    for key, value, ok, why in checks:
        if not ok:
            return f"{c.source}: {key} = {value}: {why}; the CUDA kernels do not cover it: {NUMPY}"
    return None


def check_card(
    capability: int, dtype: str, nvrtc: tuple[int, int], supported: tuple[int, ...] = ()
) -> None:
    """Raise UnsupportedModel where the card, the dtype on it, or the NVRTC that would
    compile for it is not covered (CudaBackend's constructor: before any allocation)."""
    reason = card_refusal(capability, dtype) or nvrtc_refusal(capability, nvrtc, supported)
    if reason:
        raise UnsupportedModel(reason)


def check_model(config: ModelConfig, capability: int, dtype: str = "bfloat16") -> None:
    """Raise UnsupportedModel where the kernels do not cover this model on a card of
    `capability` in `dtype` (CudaBackend.load_weights and alloc_state, before the upload)."""
    reason = card_refusal(capability, dtype) or model_refusal(config)
    if reason:
        raise UnsupportedModel(reason)
