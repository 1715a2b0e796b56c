"""The served model as Ollama's API describes it: an entry of `/api/tags` and `/api/ps`, and
`/api/show`'s answer. The fields are Ollama's, each present even where Ollama leaves an
empty one out, since clients written against it read them as required (Enchanted's
OllamaKit fails the whole list without `digest` or `details`, and `/api/show` without
`license`, `modelfile`, `template` and `parameters`; it also reads times only with their
fractional seconds, as Ollama writes them).

The context length reported (`{arch}.context_length` in `model_info`, `num_ctx` in
`parameters`, `context_length` in `/api/ps`) is the one the server runs with, not the
longest the model was trained for: clients size their prompts by it (Continue reads
`num_ctx`, VS Code's Copilot the `model_info` key).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from engine.server.app import OpenAIServer

ARCHITECTURE = "qwen3_5"  # the config's model_type, as Ollama names a safetensors model's family
CAPABILITIES = ["completion", "tools", "thinking"]
# A model stays loaded until the server stops: `expires_at` as Ollama writes "never".
FOREVER = datetime(2318, 8, 28, tzinfo=UTC)
LICENSE_FILES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE")
MAX_LICENSE_BYTES = 256 << 10


def stamp(when: datetime) -> str:
    """A time as Ollama writes it (RFC 3339, UTC, with its fractional seconds)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parameter_size(tensors: Any) -> str:
    """The checkpoint's parameter count as Ollama writes it ("751.63M", "4.21B")."""
    count = parameter_count(tensors)
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.2f}M"


def parameter_count(tensors: Any) -> int:
    return sum(int(np.prod(t.shape)) for t in tensors)


def quantization_level(tensors: Any) -> str:
    """How the matrices are stored: "Q4" (with its group size, MLX affine) or the float type."""
    quant = next((t.quant for t in tensors if t.quant is not None), None)
    if quant is not None:
        return f"Q{quant.bits}_G{quant.group_size}"
    dtypes = {t.dtype for t in tensors if len(t.shape) == 2}
    return next(iter(dtypes)).upper() if len(dtypes) == 1 else "/".join(sorted(dtypes)).upper()


class ModelCard:
    """What Ollama's routes say of the one model `server` runs (worked out once)."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server
        engine = server.engine
        self.checkpoint = engine.checkpoint
        self.folder = Path(engine.model_dir)
        named = sorted(self.checkpoint.tensors.items())
        tensors = [t for _, t in named]
        shapes = "\n".join(f"{n} {t.dtype} {list(t.shape)}" for n, t in named)
        # Ollama's digest names a model's manifest; here the checkpoint's tensors (names,
        # types, shapes) and its config, so it changes when the model does.
        config = self.folder / "config.json"
        seen = hashlib.sha256(shapes.encode())
        seen.update(config.read_bytes() if config.is_file() else b"")
        self.digest = seen.hexdigest()
        self.count = parameter_count(tensors)
        self.details = {
            "parent_model": "",
            "format": "safetensors",
            "family": ARCHITECTURE,
            "families": [ARCHITECTURE],
            "parameter_size": parameter_size(tensors),
            "quantization_level": quantization_level(tensors),
        }

    def modified_at(self) -> str:
        """When the checkpoint's folder last changed (the server's start where unknown)."""
        try:
            when = self.folder.stat().st_mtime
        except OSError:
            when = self.server.created
        return stamp(datetime.fromtimestamp(when, UTC))

    def listed(self) -> dict[str, Any]:
        """The model's entry in `/api/tags`."""
        s = self.server
        return {
            "name": s.model_id,
            "model": s.model_id,
            "modified_at": self.modified_at(),
            "size": self.checkpoint.total_bytes,
            "digest": self.digest,
            "details": self.details,
            "capabilities": CAPABILITIES,
        }

    def running(self) -> dict[str, Any]:
        """The model's entry in `/api/ps`: the memory it holds (`size`) and the part of it
        on the card (`size_vram`: none for the numpy backend, which runs on the CPU), as
        `ollama ps` divides them into its CPU/GPU column."""
        engine = self.server.engine
        held, weights = engine.held_bytes(), self.checkpoint.total_bytes
        on_card = engine.backend_name != "numpy"
        return {
            "name": self.server.model_id,
            "model": self.server.model_id,
            "size": max(held, weights) if on_card else weights + held,
            "digest": self.digest,
            "details": self.details,
            "expires_at": stamp(FOREVER),
            "size_vram": held if on_card else 0,
            "context_length": engine.context,
        }

    def shown(self) -> dict[str, Any]:
        """`/api/show`'s answer."""
        s = self.server
        config, context = self.checkpoint.config, s.engine.context
        arch = ARCHITECTURE
        info = {
            "general.architecture": arch,
            "general.parameter_count": self.count,
            f"{arch}.context_length": context,
            f"{arch}.embedding_length": config.hidden_size,
            f"{arch}.block_count": config.num_hidden_layers,
            f"{arch}.feed_forward_length": config.intermediate_size,
            f"{arch}.attention.head_count": config.num_attention_heads,
            f"{arch}.attention.head_count_kv": config.num_key_value_heads,
            f"{arch}.vocab_size": config.vocab_size,
        }
        parameters = f"{'num_ctx':<30} {context}"
        modelfile = (
            "# The model Snug serves (it renders the checkpoint's own chat template)\n"
            f"FROM {self.folder}\nPARAMETER num_ctx {context}\n"
        )
        return {
            "license": self.license(),
            "modelfile": modelfile,
            "parameters": parameters,
            "template": s.tokenizer.template or "",
            "details": self.details,
            "model_info": info,
            "capabilities": CAPABILITIES,
            "modified_at": self.modified_at(),
        }

    def license(self) -> str:
        """The checkpoint's license file's text, or "" where it has none."""
        for name in LICENSE_FILES:
            path = self.folder / name
            try:
                if path.is_file() and path.stat().st_size <= MAX_LICENSE_BYTES:
                    return path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
        return ""
