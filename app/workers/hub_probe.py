"""What a Hugging Face repository holds, asked before any of it is downloaded: whether it is
a Qwen3.5 model Snug runs, its config.json, and the bytes of its weights ("Add from Hugging
Face…" in the Models tab). The library then plans it like a catalog model, from the config.

Runs on a thread of its own (the panel's); every refusal is a RepoRefused whose message
names the repository and what to do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from app.workers.downloader import LOGIN, explain
from app.workers.hub_files import commit_hash
from engine.model_config import parse_config

REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
HUB_URL = re.compile(r"^(https?://)?(www\.)?(huggingface\.co|hf\.co)/", re.IGNORECASE)
MAX_CONFIG_BYTES = 1 << 20


class RepoRefused(Exception):
    """A repository that cannot be added; the message says which and why."""


@dataclass(frozen=True)
class RepoInfo:
    repo: str
    config: dict[str, Any]  # its config.json, as published
    weight_bytes: int  # its *.safetensors files together
    commit: str


def repo_id(text: str) -> str:
    """`owner/name` from what a person types or pastes: a hub address with or without its
    scheme, of the repository or of a page or file in it (`/tree/main`, `/blob/main/x`,
    `/resolve/main/x`, `?library=…`, `#…`), a trailing slash."""
    text = re.sub(r"\s*/\s*", "/", HUB_URL.sub("", text.strip())).strip("/")
    text = re.split(r"[?#]", text, maxsplit=1)[0].strip("/")
    parts = text.split("/")
    pages = ("tree", "blob", "resolve", "discussions", "commits", "commit")
    text = "/".join(parts[:2]) if len(parts) > 2 and parts[2] in pages else text
    if not REPO_ID.fullmatch(text):
        raise RepoRefused(
            f"'{text}' is not a repository id: write it as owner/name, for example "
            "mlx-community/Qwen3.5-4B-MLX-4bit"
        )
    return text


def probe_repo(text: str, endpoint: str | None = None) -> RepoInfo:
    """The repository `text` names, checked to hold a Qwen3.5 model in safetensors."""
    repo = repo_id(text)
    try:
        from huggingface_hub import HfApi

        info = HfApi(endpoint=endpoint).model_info(repo, revision="main", files_metadata=True)
        commit = commit_hash(repo, info.sha)
        sizes = {str(s.rfilename): int(s.size or 0) for s in info.siblings or []}
        if "config.json" not in sizes:
            raise RepoRefused(f"{repo} has no config.json: it is not a model Snug can read.")
        weights = sum(n for name, n in sizes.items() if name.endswith(".safetensors"))
        if not any(name.endswith(".safetensors") for name in sizes):
            raise RepoRefused(
                f"{repo} has no .safetensors weights (a GGUF repository?): Snug reads "
                "safetensors; add the model's bf16 or MLX 4-bit repository instead."
            )
        config = _config(repo, commit, endpoint)
    except RepoRefused:
        raise
    except Exception as exc:  # the Hub's errors, the network's: said as the downloads say them
        said = explain(exc, repo)
        if said.startswith("Cannot reach"):  # nothing was downloaded: no parts to speak of
            said = f"{said.split('. ')[0]}. Check the network connection and add it again."
        said = said.replace("and download again", "and add it again")  # nothing to resume
        raise RepoRefused(said) from exc
    _check_qwen35(repo, config)
    return RepoInfo(repo, config, weights, commit)


def _config(repo: str, commit: str, endpoint: str | None) -> dict[str, Any]:
    import httpx
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(repo, "config.json", revision=commit, endpoint=endpoint)
    with httpx.stream("GET", url, headers=build_hf_headers(), follow_redirects=True) as r:
        _check_answer(repo, r)
        body = b""
        for chunk in r.iter_bytes():
            body += chunk
            if len(body) > MAX_CONFIG_BYTES:
                raise RepoRefused(f"{repo}'s config.json is over 1 MiB: not a model's config.")
    try:
        raw = json.loads(body)
    except ValueError as exc:
        raise RepoRefused(f"{repo}'s config.json is not JSON ({exc}).") from None
    if not isinstance(raw, dict):
        raise RepoRefused(f"{repo}'s config.json does not hold a JSON object.")
    return raw


def _check_answer(repo: str, response: Any) -> None:
    """A refusal of the config.json said as what to do: the Hub lists a gated repository's
    files to anyone, then answers 401 (403 once logged in without access) for each one."""
    status = response.status_code
    if status < 400:
        return
    if status in (401, 403) and response.headers.get("X-Error-Code") == "GatedRepo":
        raise RepoRefused(
            f"{repo} is gated: accept its licence on its page on huggingface.co, then "
            f"{LOGIN}, and add it again."
        )
    if status in (401, 403):
        raise RepoRefused(f"The Hub refused {repo}'s config.json ({status}): {LOGIN}.")
    raise RepoRefused(
        f"The Hub answered {status} for {repo}'s config.json; try adding it again later."
    )


def _check_qwen35(repo: str, raw: dict[str, Any]) -> None:
    kind = str(raw.get("model_type", ""))
    if not kind.startswith("qwen3_5"):
        raise RepoRefused(
            f"{repo} is a {kind or 'model of unknown type'} model; Snug runs Qwen3.5 models "
            "(model_type qwen3_5)."
        )
    if "moe" in kind:
        raise RepoRefused(f"{repo} is a Qwen3.5 mixture-of-experts model, which Snug does not run.")
    try:
        parse_config(raw, source=f"{repo}/config.json")
    except Exception as exc:  # ConfigError and what a damaged config raises
        raise RepoRefused(f"{repo}: {exc}") from None


def format_of(raw: dict[str, Any]) -> tuple[str, str | None, int]:
    """(quant label, the planner's format, group size) of a config; the format is None where
    the planner has none for it (the model is then planned from its files once downloaded)."""
    quant = raw.get("quantization") or raw.get("quantization_config")
    if not quant:
        return "bf16", "bf16", 0
    bits = quant.get("bits") if isinstance(quant, dict) else None
    group = quant.get("group_size") if isinstance(quant, dict) else None
    label = f"{bits}-bit" if isinstance(bits, int) else "quantized"
    if bits == 4 and isinstance(group, int) and group > 0:
        return label, "mlx4", group
    return label, None, 0
