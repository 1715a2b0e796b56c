"""`snug` subcommands: generate, chat, info, plan, serve, cache. (`snug` alone starts the app:
see app/entry.py.)"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from engine.cli_cache import add_cache_parser
from engine.cli_plan import (
    add_kv_cache_flag,
    add_plan_parser,
    finite_float,
    gib_arg,
    int_at_least,
    with_kv_cache,
)
from engine.cli_progress import context_note, cpu_note, load_progress, prompt_progress
from engine.config import DRAFT_CHOICES, EngineSettings
from engine.errors import CheckpointError, RequestRefused, SnugError
from engine.request_types import progress_args
from engine.sampling import RECOMMENDED
from engine.server.cli import add_serve_parser, run_serve


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids such as 1,2,3, got {text[:80]!r}"
        ) from None
    if not ids:  # refused here, not after the (slow) load
        raise argparse.ArgumentTypeError("no token ids given; pass them as 1,2,3")
    negative = [i for i in ids if i < 0]
    if negative:
        raise argparse.ArgumentTypeError(f"token id {negative[0]} is negative; ids are >= 0")
    return ids


def _utf8_text(text: str) -> str:
    """Command-line text that was valid UTF-8 (Python maps invalid bytes in argv to lone
    surrogates, which the tokenizer cannot encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = text.encode("utf-8", "surrogateescape")
        where = len(text[: exc.start].encode("utf-8", "surrogateescape"))
        raise argparse.ArgumentTypeError(
            f"is not valid UTF-8 text (byte 0x{raw[where]:02x} at offset {where}); pass UTF-8, "
            "or token ids with --prompt-ids"
        ) from None
    return text


def _add_memory_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reserve-gib",
        type=gib_arg,
        default=None,
        help="memory left for other programs (default 0.5, env SNUG_MEMORY_RESERVE_GIB)",
    )
    p.add_argument(
        "--limit-gib",
        type=gib_arg,
        default=None,
        help="cap on what Snug may hold on the GPU (env SNUG_MEMORY_LIMIT_GIB)",
    )


def _add_sampling_flags(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    p.add_argument(
        "--max-new-tokens",
        type=int_at_least(1),
        default=max_new_tokens,
        help=f"at least 1 (default {max_new_tokens})",
    )
    p.add_argument(
        "--greedy",
        action="store_true",
        help="the likeliest token each step (no presence penalty unless --presence-penalty)",
    )
    # Unset, each knob takes Qwen3.5's recommended value for the reply's mode (RECOMMENDED:
    # one set where the reply thinks first, one where it does not).
    mode = "{}, or {} where the reply thinks first: the model card's"
    for name, kind in _SAMPLING_FLAGS:
        plain, thinking = RECOMMENDED[False][name], RECOMMENDED[True][name]
        said = f"{plain}" if plain == thinking else mode.format(plain, thinking)
        off = {"top_k": "; 0 = off", "presence_penalty": "; from -2 to 2"}.get(name, "")
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, help=f"default {said}{off}")
    p.add_argument("--seed", type=int_at_least(0), default=None)


def _penalty(text: str) -> float:
    """--presence-penalty: from -2 to 2, as the server and OpenAI's API take it (a penalty far
    outside that range takes every token seen off the table, or leaves only them)."""
    value = finite_float(text)
    if not -2 <= value <= 2:
        raise argparse.ArgumentTypeError(f"must be from -2 to 2, got {value:g}")
    return value


_SAMPLING_FLAGS = (
    ("temperature", finite_float),
    ("top_k", int_at_least(0)),
    ("top_p", finite_float),
    ("min_p", finite_float),
    ("presence_penalty", _penalty),
)


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=["auto", "cuda", "numpy"],
        default=None,
        help="default: auto (env SNUG_BACKEND)",
    )
    p.add_argument(
        "--context",
        type=int_at_least(1),
        default=4096,
        help="tokens per stream, at least 1; capped at the model's max_position_embeddings "
        "(default 4096)",
    )
    p.add_argument(
        "--max-rows",
        type=int_at_least(1),
        default=None,
        help="prompt rows per forward pass, at least 1 (default: the plan's choice, 512 or "
        "wider where the card has memory left over)",
    )
    p.add_argument(
        "--draft-tokens",
        choices=DRAFT_CHOICES,
        default=None,
        help="tokens drafted a step with the checkpoint's MTP head: off, 1, 2, 3 or auto "
        "(default: env SNUG_DRAFT_TOKENS, else off)",
    )
    _add_memory_flags(p)
    add_kv_cache_flag(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snug", description="Run Qwen3.5 models locally.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("--model", required=True, help="checkpoint folder (config.json, safetensors)")
    # Neither given: the prompt is read from a pipe (main() asks for one at a terminal).
    src = g.add_mutually_exclusive_group()
    src.add_argument(
        "--prompt",
        type=_utf8_text,
        help="a user message (chat template applied unless --raw); '-', or no --prompt with "
        "the prompt piped in: read from standard input",
    )
    src.add_argument("--prompt-ids", type=_parse_ids, help="token ids, e.g. 1,2,3")
    g.add_argument("--raw", action="store_true", help="tokenize --prompt as is, no template")
    g.add_argument("--system", type=_utf8_text, help="system prompt for the chat template")
    g.add_argument("--thinking", choices=["on", "off", "default"], default="default")
    _add_budget_flag(g)
    g.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="FILE",
        help="a text file, PDF or Word document the model reads before --prompt (repeatable)",
    )
    _add_sampling_flags(g, max_new_tokens=256)
    _add_engine_flags(g)
    g.add_argument("--json", action="store_true", help="print one JSON object at the end")

    c = sub.add_parser("chat", help="a conversation with the model in the terminal")
    c.add_argument("--model", required=True, help="checkpoint folder (config.json, safetensors)")
    c.add_argument("--system", type=_utf8_text, help="system prompt for the chat template")
    c.add_argument("--thinking", choices=["on", "off", "default"], default="default")
    _add_budget_flag(c)
    _add_sampling_flags(c, max_new_tokens=2048)
    _add_engine_flags(c)

    i = sub.add_parser("info", help="print a checkpoint's config, format and byte sizes")
    i.add_argument("--model", required=True)
    i.add_argument("--json", action="store_true")

    add_plan_parser(sub)
    add_serve_parser(sub)
    add_cache_parser(sub)
    parser.commands = sub.choices  # type: ignore[attr-defined]
    return parser


def _settings(args: argparse.Namespace) -> EngineSettings:
    settings = EngineSettings.from_env().with_gib(reserve=args.reserve_gib, limit=args.limit_gib)
    if getattr(args, "backend", None):
        settings = dataclasses.replace(settings, backend=args.backend)
    if getattr(args, "draft_tokens", None):
        settings = dataclasses.replace(settings, draft_tokens=args.draft_tokens)
    return with_kv_cache(settings, args)


def run_generate(args: argparse.Namespace) -> int:
    from engine.attachments import compose, read_attachment

    if args.prompt == "-" or (args.prompt is None and args.prompt_ids is None):
        args.prompt = _stdin_prompt(sys.stdin)
    if args.attach:  # read before the load: a file refused costs no load
        if args.prompt is None or args.raw:
            raise RequestRefused("--attach goes with --prompt, through the chat template")
        args.prompt = compose(args.prompt, [read_attachment(path) for path in args.attach])
    _params(args)  # a sampling flag out of range is refused before the (slow) load
    engine = _load(args)
    try:
        return _generate(engine, args)
    finally:
        engine.unload()


def run_chat(args: argparse.Namespace) -> int:
    from engine.checkpoint.checkpoint import model_name
    from engine.cli_chat import chat
    from engine.thinking_budget import starts_thinking

    _params(args)  # a sampling flag out of range is refused before the load
    engine = _load(args)
    thinking = {"on": True, "off": False}.get(args.thinking)
    probe = engine.chat_ids([{"role": "user", "content": "Hi"}], enable_thinking=thinking)
    params = _params(args, starts_thinking(engine, probe))  # every reply of the chat starts so
    name, streams = model_name(args.model), (sys.stdin, sys.stdout, sys.stderr)
    _utf8_input(sys.stdin)
    try:
        budget = args.thinking_budget
        return chat(engine, name, params, args.system, thinking, *streams, thinking_budget=budget)
    finally:
        engine.unload()


def _stdin_prompt(stdin) -> str:
    """The prompt piped into standard input, as --prompt takes it (its last line's newline
    left out), read before the load: no more than an attached file may hold, in UTF-8."""
    from engine.attachments import MAX_FILE_BYTES

    source = getattr(stdin, "buffer", None)
    data = source.read(MAX_FILE_BYTES + 1) if source is not None else stdin.read().encode()
    if len(data) > MAX_FILE_BYTES:
        raise RequestRefused(
            f"standard input holds more than {MAX_FILE_BYTES >> 20} MiB, more than a prompt "
            "may take; pipe in the part you need"
        )
    if not data.strip():
        raise RequestRefused("standard input is empty; pipe the prompt in, or give --prompt TEXT")
    try:
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise RequestRefused(
            f"standard input is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); convert it to UTF-8, or pass token ids with --prompt-ids"
        ) from None


def _utf8_input(stdin) -> None:
    """The chat's input read so that bytes that are not UTF-8 reach the chat (which refuses
    that message alone), and, where the input's encoding is ASCII (PYTHONIOENCODING=ascii),
    read as UTF-8, of which ASCII is a part: a message typed in UTF-8 is then read as typed
    rather than refused as not UTF-8."""
    if not hasattr(stdin, "reconfigure"):
        return
    try:
        ascii_only = codecs.lookup(stdin.encoding or "").name == "ascii"
    except (LookupError, TypeError):
        ascii_only = False
    try:
        if ascii_only:
            stdin.reconfigure(encoding="utf-8", errors="surrogateescape")
        else:
            stdin.reconfigure(errors="surrogateescape")
    except (OSError, ValueError):  # already read from: it stays as it was
        pass


def _add_budget_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--thinking-budget",
        type=int_at_least(0),
        default=0,
        metavar="N",
        help="the most tokens a reply thinks before it answers (0: no limit)",
    )


def _load(args: argparse.Namespace):
    from engine.session import Engine

    settings = _settings(args)
    engine = Engine.load(
        args.model,
        settings,
        context=args.context,
        max_rows=args.max_rows,
        progress=load_progress(),
    )
    cpu_note(engine, settings)
    context_note(engine, args.context)
    return engine


def _params(args: argparse.Namespace, thinking: bool = False):
    """The sampling flags as GenerationParams, those not given as Qwen3.5's recommended
    values for a reply that thinks first or not (`thinking`); a flag out of range is
    refused by its name."""
    from engine.session import GenerationParams

    values = {
        "max_new_tokens": args.max_new_tokens,
        **{name: getattr(args, name) for name, _ in _SAMPLING_FLAGS},
        "seed": args.seed,
        "greedy": args.greedy,
    }
    values |= {k: v for k, v in RECOMMENDED[thinking].items() if values[k] is None}
    if (args.greedy or values["temperature"] == 0) and args.presence_penalty is None:
        values["presence_penalty"] = 0.0  # greedy is the plain argmax unless a penalty is asked
    try:
        return GenerationParams(**values)
    except SnugError as exc:
        for key, value in values.items():  # which flag: the one refused on its own
            try:
                GenerationParams(**{key: value})
            except SnugError:
                raise SnugError(f"--{key.replace('_', '-')} {value}: {exc}") from None
        raise


def _prompt_ids(engine, args: argparse.Namespace) -> list[int]:
    if args.prompt_ids is not None:
        outside = [i for i in args.prompt_ids if i >= engine.vocab_rows]
        if outside:
            raise RequestRefused(
                f"--prompt-ids: token id {outside[0]} is outside the vocabulary of "
                f"{engine.vocab_rows} tokens (ids 0 to {engine.vocab_rows - 1})"
            )
        return args.prompt_ids
    if args.raw:
        return engine.tokenizer.encode(args.prompt)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.prompt})
    thinking = {"on": True, "off": False}.get(args.thinking)
    return engine.chat_ids(messages, enable_thinking=thinking)


def _generate(engine, args: argparse.Namespace) -> int:
    from engine.thinking_budget import applies, generate_within, starts_thinking

    prompt_ids = _prompt_ids(engine, args)
    params = _params(args, starts_thinking(engine, prompt_ids))
    output_ids, text, stats, finish = [], [], None, None
    t0 = time.perf_counter()
    more = progress_args(engine, prompt_progress())
    cancel = threading.Event()  # Ctrl+C: the reply ends at its next token, stats still said
    handler = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    try:
        budget = args.thinking_budget
        if applies(engine, prompt_ids, budget):
            events = generate_within(engine, prompt_ids, params, budget, cancel, **more)
        else:
            events = engine.generate(prompt_ids, params, cancel, **more)
        for event in events:
            if event.token_id >= 0:  # a final event may carry no token (NO_TOKEN)
                output_ids.append(event.token_id)
            text.append(event.text)
            if not args.json and event.text:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            if event.finished:
                stats = event.stats
                finish = event.finish_reason
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    if args.json:
        timings = {"total_s": time.perf_counter() - t0, **(stats.__dict__ if stats else {})}
        print(
            json.dumps(
                {
                    "prompt_ids": list(prompt_ids),
                    "output_ids": output_ids,
                    "text": "".join(text),
                    "finish_reason": finish,
                    "backend": engine.backend_name,
                    "drafting": engine.drafting,
                    "timings": timings,
                }
            )
        )
    else:
        sys.stdout.write("\n")
        if stats:
            sys.stderr.write(
                f"[{engine.backend_name}] {stats.prompt_tokens} prompt "
                f"token{'' if stats.prompt_tokens == 1 else 's'}, "
                f"{stats.new_tokens} new; first token {stats.ttft_s * 1000:.0f} ms"
                # one token has no decode rate (it is the first token's)
                + (f"; {stats.decode_tok_s:.1f} tokens/s\n" if stats.new_tokens > 1 else "\n")
            )
        asked = engine.drafter is not None or _settings(args).draft_tokens != "off"
        if engine.drafting and asked:  # said when drafting was asked for, not every reply
            on = stats is not None and engine.drafter is not None
            kept = f"; {stats.drafts_kept} of {stats.drafted} drafts kept" if on else ""
            sys.stderr.write(f"[drafting] {engine.drafting}{kept}\n")
    if finish == "cancelled":
        sys.stderr.write("snug: stopped (Ctrl+C)\n")
        return 130
    return 0


def _model_folder(where: str) -> Path:
    """--model's checkpoint folder: a folder, or a repository id in the HF cache."""
    from engine.checkpoint.checkpoint import find_model

    if not where.strip():  # not the current folder by accident
        raise CheckpointError("--model is empty; give a checkpoint's folder or repository id")
    if not Path(where).expanduser().exists():  # a Hub address pasted from a browser
        where = _repo_of(where)
    path = find_model(where)
    if not path.exists():
        raise CheckpointError(f"--model {where}: there is no such folder ({path.absolute()})")
    if not path.is_dir():
        raise CheckpointError(
            f"--model {where} is a file; give the folder that holds the checkpoint "
            f"({path.absolute().parent})"
        )
    return path


_HUB_ADDRESS = re.compile(
    r"^(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/([^/?#\s]+/[^/?#\s]+)", re.IGNORECASE
)


def _repo_of(where: str) -> str:
    """The repository id in a Hub address (`https://huggingface.co/owner/name/tree/main`),
    or in an id with a slash after it; anything else as it is."""
    found = _HUB_ADDRESS.match(where.strip())
    return found.group(1) if found else where.rstrip("/") or where


def _tolerant_output() -> None:
    """Where the terminal's encoding is not UTF-8 (a latin-1 locale, PYTHONIOENCODING=ascii,
    a Windows console), text it cannot show (a reply, a path) comes out as '?' instead of
    ending the command with a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        try:
            utf8 = codecs.lookup(stream.encoding or "").name == "utf-8"
        except (AttributeError, LookupError, TypeError):
            continue
        if not utf8 and getattr(stream, "errors", "") in ("strict", "surrogateescape"):
            stream.reconfigure(errors="replace")


def main(argv: list[str] | None = None) -> int:
    _tolerant_output()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said with the command's own usage, which lists the flags it takes
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "generate" and args.prompt is None and args.prompt_ids is None:
        if getattr(sys.stdin, "isatty", lambda: True)():  # nothing piped in to read
            parser.commands["generate"].error(
                "one of the arguments --prompt --prompt-ids is required (or pipe the prompt "
                "into standard input)"
            )
    try:
        if getattr(args, "model", None) is not None:  # a folder, or a repository id
            args.model = str(_model_folder(args.model))
        if args.command == "generate":
            return run_generate(args)
        if args.command == "chat":
            return run_chat(args)
        if args.command == "info":
            from engine.cli_info import run_info

            return run_info(args)
        if args.command == "serve":
            return run_serve(args)
        if args.command == "cache":
            return args.func(args)
        if args.command == "plan":
            from engine.cli_plan import run_plan

            return run_plan(args)
    except SnugError as exc:
        sys.stderr.write(f"snug: {type(exc).__name__}: {exc}\n")
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # Ctrl+C while the model loads (a reply stops by itself)
        sys.stderr.write("\nsnug: interrupted\n")
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
