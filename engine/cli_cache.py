"""`snug cache info|clear`: the prompt cache's saved states on disk (engine.prompt_cache).

    snug cache info                 what the folder holds
    snug cache clear                remove every saved state
    snug cache clear --model DIR    only those of one checkpoint (any engine version)

The folder is SNUG_PROMPT_CACHE_DIR, else `prompt-cache` in the app's data folder
(~/.local/share/Snug/Snug on Linux); `--dir` names another. `clear` refuses a folder that
holds *.json or *.safetensors files no saved state is named like (a model's folder
given by mistake), and removes nothing there.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from engine.config import ENV_PROMPT_CACHE, default_prompt_cache_dir
from engine.errors import ConfigError


def add_cache_parser(subparsers) -> argparse.ArgumentParser:
    """Register `cache` on an argparse subparsers object."""
    p = subparsers.add_parser("cache", help="show or clear the saved prompt states on disk")
    sub = p.add_subparsers(dest="cache_command", required=True)
    info = sub.add_parser("info", help="the folder, its saved states and their size")
    clear = sub.add_parser("clear", help="remove saved prompt states")
    clear.add_argument("--model", help="only the states of this checkpoint folder")
    for q in (info, clear):
        q.add_argument(
            "--dir",
            help="the cache folder (default: SNUG_PROMPT_CACHE_DIR, else prompt-cache in "
            "the app's data folder)",
        )
    p.set_defaults(func=run_cache)
    return p


def others(folder: Path) -> list[str]:
    """The *.json, *.safetensors and *.tmp files in `folder` that are no saved state's
    (engine.snapshot_folder.is_state_file): a model's config.json and weights, say."""
    from engine.snapshot_folder import is_state_file

    if not folder.is_dir():
        return []
    found = (*folder.glob("*.json"), *folder.glob("*.safetensors"), *folder.glob("*.tmp"))
    return sorted(p.name for p in found if not is_state_file(p.name))


def run_cache(args: argparse.Namespace) -> int:
    from engine.snapshot_folder import clear_folder, files_size
    from engine.snapshot_store import model_fingerprint

    folder = Path(args.dir) if args.dir else default_prompt_cache_dir()
    folder = folder.expanduser()  # as the engine reads SNUG_PROMPT_CACHE_DIR
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} is a file, not a prompt cache folder; check {_setting(args)}")
    if folder.is_dir():
        try:  # a glob takes a folder it may not list for an empty one
            with os.scandir(folder) as listed:
                next(listed, None)
        except OSError as exc:
            raise ConfigError(
                f"{folder} cannot be read ({exc.strerror or exc}); nothing was changed. Run "
                f"as the user who owns it, or check {_setting(args)}"
            ) from None
    foreign = others(folder)
    if args.cache_command == "clear" and foreign:
        raise ConfigError(
            f"{folder} is not a prompt cache folder: it holds {_some(foreign)}, which are no "
            f"saved prompt states; nothing was removed. Check {_setting(args)}"
        )
    if args.cache_command == "clear":
        model = None
        if args.model:
            from engine.checkpoint import Checkpoint

            checkpoint = Checkpoint.open(Path(args.model))
            model = model_fingerprint(checkpoint.dir, checkpoint.tensors)
        done = clear_folder(folder, model)
        which = f" of {args.model}" if args.model else ""
        print(
            f"removed {done.count} saved prompt states{which} ({_mib(done.nbytes)}) from {folder}"
        )
        if done.kept:
            raise ConfigError(
                f"{done.kept} saved prompt states{which} in {folder} could not be removed (the "
                "log above names each file and why); they stay readable there. Make the folder "
                "writable for this user, close the programs that hold its files, and run "
                "`snug cache clear` again"
            )
        return 0
    entries, nbytes = 0, 0
    kinds: dict[str, int] = {}
    for meta_path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if meta_path.name in foreign:
            continue
        try:
            meta = json.loads(meta_path.read_text())
            kind = f"engine {meta.get('engine')}, {meta.get('precision')}"
        except FileNotFoundError:
            continue  # evicted since the listing by an engine using the folder
        except (OSError, ValueError, AttributeError, RecursionError):
            kind = "unreadable"
        nbytes += files_size(folder, meta_path.stem)
        entries += 1
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"{folder}: {entries} saved prompt states, {_mib(nbytes)}")
    for kind, count in sorted(kinds.items()):
        print(f"  {count:5d}  {kind}")
    if foreign:
        print(f"  and {_some(foreign)}, which are no saved prompt states")
    return 0


def _setting(args: argparse.Namespace) -> str:
    """What named the folder: --dir, SNUG_PROMPT_CACHE_DIR, or neither (the default)."""
    if args.dir:
        return "--dir"
    if os.environ.get(ENV_PROMPT_CACHE, "").strip():
        return ENV_PROMPT_CACHE
    return "the app's data folder"


def _some(names: list[str]) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"
