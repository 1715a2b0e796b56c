"""`Checkpoint`: a model folder's config and weights under Snug's internal names.

Opening reads config.json and the safetensors headers, normalises HF and MLX names
(names.py), groups MLX quantized triples into one logical tensor and checks that every
tensor the forward pass needs is present with the shape config.json implies. Tensor data
is read only when asked for, one tensor (or row range) at a time.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.checkpoint.names import (
    HF,
    conv_logical_shape,
    detect_format,
    expected_tensors,
    internal_name,
    is_conv,
    is_zero_centred,
    stored_conv_layout,
)
from engine.checkpoint.quantized import QuantizedTensor
from engine.checkpoint.safetensors_file import READABLE, SafetensorsFile, WeightFiles, find_weights
from engine.errors import CheckpointError, ConfigError, quoted
from engine.model_config import ModelConfig, QuantSpec, load_config

FLOAT_DTYPES = ("bf16", "f16", "f32")


_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def find_model(where: str, cache_dir: str | None = None) -> Path:
    """The checkpoint folder `where` names: a folder, or a Hugging Face repository id
    (`mlx-community/Qwen3.5-4B-MLX-4bit`) whose download is in the Hugging Face cache (the
    one the app downloads to; `cache_dir`: another). Nothing is fetched: a repository not
    downloaded is refused, with how to download it."""
    path = Path(where).expanduser()
    if path.exists() or not _REPO_ID.match(where):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(where, cache_dir=cache_dir, local_files_only=True))
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{where} is neither a folder nor a download in the Hugging Face cache; download "
            f"it in Snug's Models tab or with `hf download {where}`, or give its folder"
        ) from None


def model_name(folder: str | Path) -> str:
    """A checkpoint folder's name as people know the model: the repository's for a snapshot
    in the Hugging Face cache (`models--org--name/snapshots/<revision>`, whose own name is a
    commit hash), else the folder's own."""
    path = Path(folder)
    repo = path.parent.parent.name
    if path.parent.name == "snapshots" and repo.startswith("models--"):
        return repo.split("--")[-1]
    return path.name or str(folder)


@dataclass(frozen=True)
class TensorInfo:
    """One logical tensor: shape as the model sees it, dtype and bytes as stored.

    `dtype` is the stored element type ('bf16', 'f16', 'f32', ...) or 'q4'/'q8' for a
    quantized matrix, whose `nbytes` counts packed codes, scales and biases together.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    quant: QuantSpec | None
    file: str


@dataclass(frozen=True)
class _Source:
    file: SafetensorsFile
    key: str  # the weight key in the file
    # Quantized modules: where scales and biases live (shards may split a triple).
    scales: tuple[SafetensorsFile, str] | None = None
    biases: tuple[SafetensorsFile, str] | None = None


class Checkpoint:
    """A validated model folder. Build with `Checkpoint.open(model_dir)`."""

    def __init__(
        self,
        model_dir: Path,
        config: ModelConfig,
        fmt: str,
        tensors: dict[str, TensorInfo],
        sources: dict[str, _Source],
    ) -> None:
        self.dir = model_dir
        self.config = config
        self.format = fmt
        self.tensors = tensors
        self._sources = sources

    @classmethod
    def open(cls, model_dir: str | os.PathLike[str]) -> Checkpoint:
        """Read config.json and the weight headers; raise ConfigError / CheckpointError.

        Raises CheckpointError naming the folder, file and tensor when weights are missing,
        truncated, of an unreadable dtype or of a shape config.json does not imply.
        """
        path = Path(model_dir)
        config = load_config(path)
        files = find_weights(path)
        fmt = detect_format(files.shapes, files.metadata)
        tensors, sources = _collect(files, fmt, config)
        ckpt = cls(path, config, fmt, tensors, sources)
        ckpt._validate()
        return ckpt

    # -- queries ---------------------------------------------------------------------------

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    @property
    def total_bytes(self) -> int:
        """Bytes of every tensor Snug exposes, as stored (vision tower excluded)."""
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def required(self) -> tuple[str, ...]:
        """The names the forward pass reads (MTP and a tied model's stray lm_head excluded)."""
        return tuple(expected_tensors(self.config))

    def norm_offset(self, name: str) -> float:
        """What `read` adds to the stored values of `name`: 1.0 for HF zero-centred norms."""
        return 1.0 if self.format == HF and is_zero_centred(name) else 0.0

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(
                f"{self.dir}: no tensor named {quoted(name)} (internal names, e.g. "
                "'layers.0.mlp.up_proj'; see docs/architecture.md)"
            ) from None

    # -- reads -----------------------------------------------------------------------------

    def read(self, name: str, rows: slice | None = None) -> np.ndarray | QuantizedTensor:
        """The tensor ready for the model, optionally only a contiguous range of rows.

        Dense: float32 in its logical shape, zero-centred HF norms returned as 1 + w, conv1d
        as [C, K]. Quantized: a `QuantizedTensor` (call `.dequantize(rows)` for floats).
        """
        info = self.info(name)
        src = self._sources[name]
        if info.quant is not None:
            assert src.scales is not None and src.biases is not None
            packed = src.file.read_raw(src.key, rows)
            (sf, sk), (bf, bk) = src.scales, src.biases
            return QuantizedTensor(
                packed=packed,
                scales=sf.read(sk, rows).astype(np.float32, copy=False),
                biases=bf.read(bk, rows).astype(np.float32, copy=False),
                bits=info.quant.bits,
                group_size=info.quant.group_size,
                shape=(packed.shape[0], info.shape[1]),
            )
        arr = src.file.read(src.key, rows).astype(np.float32, copy=False)
        if is_conv(name) and len(info.shape) == 2:
            arr = arr.reshape(arr.shape[0], info.shape[1])  # [C, 1, K] or [C, K, 1] -> [C, K]
        offset = self.norm_offset(name)
        if offset:
            arr = arr + np.float32(offset)
        return arr

    def read_raw(self, name: str) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stored arrays, unconverted (BF16 as uint16 bits, file shapes, no norm offset).

        For a quantized tensor: `(packed uint32, scales, biases)` as stored. Meant for an
        uploader that converts on the device; see `norm_offset` for the HF norm shift.
        """
        info = self.info(name)
        src = self._sources[name]
        if info.quant is not None:
            assert src.scales is not None and src.biases is not None
            (sf, sk), (bf, bk) = src.scales, src.biases
            return src.file.read_raw(src.key), sf.read_raw(sk), bf.read_raw(bk)
        return src.file.read_raw(src.key)

    # -- validation ------------------------------------------------------------------------

    def _validate(self) -> None:
        expected = expected_tensors(self.config)
        missing = [n for n in expected if n not in self.tensors]
        if missing:
            shown = ", ".join(missing[:6]) + (
                f" and {len(missing) - 6} more" if len(missing) > 6 else ""
            )
            raise CheckpointError(
                f"{self.dir}: tensor {missing[0]} is missing ({len(missing)} missing in all: "
                f"{shown}); the {self.format.upper()} weights do not match config.json "
                f"({self.config.num_hidden_layers} layers, tie_word_embeddings = "
                f"{self.config.tie_word_embeddings}), or a file is incomplete"
            )
        for name, shape in expected.items():
            info = self.tensors[name]
            src = self._sources[name]
            if info.shape != shape:
                stored = src.file.entries[src.key].shape
                layout = ""
                if is_conv(name):
                    want = stored_conv_layout(self.format)
                    layout = f" (stored as {list(stored)}; {self.format} files use {want})"
                raise CheckpointError(
                    f"{src.file.path}: tensor {name} ({quoted(src.key)}) has shape "
                    f"{list(info.shape)} but config.json implies {list(shape)}{layout}; check "
                    "that config.json belongs to these weights"
                )
            if info.quant is None and info.dtype not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"{src.file.path}: tensor {name} ({quoted(src.key)}) is stored as "
                    f"{info.dtype}, expected one of {', '.join(FLOAT_DTYPES)} (or a quantized "
                    "triple with .scales and .biases)"
                )


def _collect(
    files: WeightFiles, fmt: str, cfg: ModelConfig
) -> tuple[dict[str, TensorInfo], dict[str, _Source]]:
    """Map file keys to internal names; fold `X.weight/.scales/.biases` into one tensor `X`."""
    tensors: dict[str, TensorInfo] = {}
    sources: dict[str, _Source] = {}
    consumed: set[str] = set()

    def add(info: TensorInfo, src: _Source) -> None:
        if info.name in tensors:
            other = sources[info.name]
            raise CheckpointError(
                f"{src.file.path}: {quoted(src.key)} and {quoted(other.key)} (in "
                f"{other.file.path.name}) both map to tensor {info.name}; the file mixes two "
                "naming schemes"
            )
        tensors[info.name] = info
        sources[info.name] = src

    # Quantization is decided per module by the presence of `X.scales` (as mlx-lm loads).
    widths = {n: s[1] for n, s in expected_tensors(cfg).items() if len(s) == 2}
    for key in files.by_key:
        if not key.endswith(".scales"):
            continue
        module = key.removesuffix(".scales")
        name = internal_name(module + ".weight")
        if name is None:
            continue
        info, src = _quantized(files, module, name, cfg, widths.get(name))
        consumed.update((src.key, key, module + ".biases"))
        add(info, src)

    for key, f in files.by_key.items():
        if key in consumed:
            continue
        name = internal_name(key)
        if name is None:
            continue
        if key.endswith(".biases"):
            raise CheckpointError(
                f"{f.path}: {quoted(key)} has no matching .scales; the quantized module is "
                "incomplete"
            )
        entry = f.entries[key]
        if entry.dtype not in READABLE:
            raise CheckpointError(
                f"{f.path}: tensor {quoted(key)} has dtype {entry.dtype}, which Snug cannot read "
                f"(readable: {', '.join(READABLE)})"
            )
        shape = conv_logical_shape(entry.shape, fmt) if is_conv(name) else entry.shape
        add(
            TensorInfo(name, shape, entry.dtype.lower(), entry.nbytes, None, f.path.name),
            _Source(f, key),
        )
    return tensors, sources


def _quantized(
    files: WeightFiles, module: str, name: str, cfg: ModelConfig, width: int | None
) -> tuple[TensorInfo, _Source]:
    """One MLX quantized module: check the triple against config.json's quantization.

    `width`: the module's input width as config.json implies it (None: not a tensor the
    model reads), from which the bits and group size of a module config.json does not name
    are read off its shapes.
    """
    scales_key, weight_key, biases_key = module + ".scales", module + ".weight", module + ".biases"
    f = files.by_key[scales_key]
    for key in (weight_key, biases_key):
        if key not in files.by_key:
            raise CheckpointError(
                f"{f.path}: {quoted(scales_key)} exists but {quoted(key)} does not; the quantized "
                "module is incomplete, fetch the weights again"
            )
    spec = cfg.quantization.for_module(module) if cfg.quantization is not None else None
    if spec is None:
        raise CheckpointError(
            f"{f.path}: {module} is quantized ({quoted(scales_key)} exists) but {cfg.source} gives "
            "no quantization for it; add the converter's `quantization` entry to config.json"
        )
    wf, bf = files.by_key[weight_key], files.by_key[biases_key]
    packed, scales, biases = wf.entries[weight_key], f.entries[scales_key], bf.entries[biases_key]
    if packed.dtype != "U32" or len(packed.shape) != 2:
        raise CheckpointError(
            f"{wf.path}: quantized weight {quoted(weight_key)} is {packed.dtype} "
            f"{list(packed.shape)}; expected U32 [out, in*bits/32]"
        )
    if module not in cfg.quantization.overrides:
        spec = _stored_spec(wf.path, module, packed.shape, scales.shape, width, spec)
    out, words = packed.shape
    cols = words * 32 // spec.bits
    groups = cols // spec.group_size
    for e, ef in ((scales, f), (biases, bf)):
        if (
            e.shape != (out, groups)
            or cols % spec.group_size
            or e.dtype not in ("BF16", "F16", "F32")
        ):
            raise CheckpointError(
                f"{ef.path}: {quoted(e.name)} is {e.dtype} {list(e.shape)}, but "
                f"{quoted(weight_key)} {list(packed.shape)} at bits = {spec.bits}, "
                f"group_size = {spec.group_size} (from {cfg.source}) means in = {cols} and "
                f"needs float [{out}, {cols}/{spec.group_size}]; the quantization settings in "
                "config.json do not match the weights"
            )
    info = TensorInfo(
        name=name,
        shape=(out, cols),
        dtype=f"q{spec.bits}",
        nbytes=packed.nbytes + scales.nbytes + biases.nbytes,
        quant=spec,
        file=wf.path.name,
    )
    return info, _Source(wf, weight_key, (f, scales_key), (bf, biases_key))


def _stored_spec(
    path: Path,
    module: str,
    packed: tuple[int, ...],
    scales: tuple[int, ...],
    width: int | None,
    default: QuantSpec,
) -> QuantSpec:
    """The bits and group size a module config.json does not name was packed with, read off
    its shapes against its input width: bits = 32 * words / width, group = width / groups.

    mlx-lm's loader does the same for such modules, so a file whose top-level entry is not
    what every module holds (an 8-bit embedding in a 4-bit model, per-module entries lost)
    loads as it does there. Shapes that give no whole bits and group size leave `default`,
    which the caller's shape checks then report against.
    """
    if width is None or len(scales) != 2 or not scales[1]:
        return default
    words, groups = packed[1], scales[1]
    if (words * 32) % width or width % groups:
        return default
    bits, group = words * 32 // width, width // groups
    if (bits, group) == (default.bits, default.group_size):
        return default
    try:
        return QuantSpec(bits, group)
    except ConfigError as exc:
        raise CheckpointError(
            f"{path}: {module} is stored as {bits}-bit codes in groups of {group} (read off its "
            f"shapes; config.json names no quantization for it): {exc}"
        ) from None
