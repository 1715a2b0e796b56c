"""llama.cpp beside Snug on the same GPU: its decode and prompt speed for a Qwen3.5 shape.

The llama-cpp-python source distribution on PyPI vendors llama.cpp. This tool builds its
`llama-bench` and `llama-quantize` from those sources, converts a random checkpoint at a
real shape (engine/testing/synth.py, Hugging Face layout, bf16) with llama.cpp's own
`convert_hf_to_gguf.py`, quantizes it to Q4_0 and times it with `llama-bench` (flash
attention on, every layer on the GPU). The weights are random, as in Snug's benchmarks;
llama.cpp's speed does not depend on their values. The converter reads the model's
tokenizer, which a random checkpoint has none of: the Qwen3.5 vocabulary llama.cpp keeps
for its tokenizer tests (models/ggml-vocab-qwen35.gguf) stands in, padded to the model's
vocab size as the converter pads a real one.

    python3 tools/llamacpp.py pack --out .llama-src.tgz      # here: the sources, trimmed
    python3 tools/llamacpp.py bench --src .llama-src.tgz --shape 4B --out OUT   # GPU machine
    python3 tools/llamacpp.py bench --prepare-only ...   # build and convert only (no GPU use)

`pack` downloads the source distribution with pip (or takes --sdist) and keeps what a build
and the converter need (no git history, test vocabularies but the Qwen3.5 one, docs), small
enough to travel to a device run. `bench` builds in --workdir (CUDA where `nvcc` is found,
for this GPU's architecture; the CPU backend otherwise), reuses a build that is there, and
prints a table (prompt tokens/s and the time to the first token of each --prompts length,
decode tokens/s) and writes llamacpp.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from engine.testing.receipt import commit

REPO = Path(__file__).resolve().parents[1]
VOCAB = "models/ggml-vocab-qwen35.gguf"
# What the build and the converter do not need: the vendored repository's history, the
# other tokenizer-test vocabularies, documentation and media.
DROP = (".git/", "docs/", "media/", "models/")
TARGETS = ("llama-bench", "llama-quantize")


def pack(sdist: Path | None, out: Path) -> None:
    """The vendored llama.cpp of a llama-cpp-python source distribution, trimmed, as a
    tar.gz whose top folder is llama.cpp/."""
    with tempfile.TemporaryDirectory() as tmp:
        if sdist is None:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
            subprocess.run([*cmd, "llama-cpp-python", "-d", tmp], check=True)
            sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as src, tarfile.open(out, "w:gz") as dst:
            for member in src:
                parts = member.name.split("/", 3)
                if len(parts) < 4 or parts[1:3] != ["vendor", "llama.cpp"]:
                    continue
                rel = parts[3]
                if rel.startswith(DROP) and rel != VOCAB:
                    continue
                data = src.extractfile(member) if member.isfile() else None
                member.name = f"llama.cpp/{rel}"
                member.pax_headers.pop("path", None)  # a long name's header would win over it
                dst.addfile(member, data)
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB from {sdist.name}")


def smi(field: str) -> str | None:
    """The first GPU's `field` as nvidia-smi reports it (compute_cap, name), or None."""
    try:
        got = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return got.stdout.splitlines()[0].strip() if got.stdout.strip() else None


def gpu_arch() -> str | None:
    """This GPU's compute capability as CMake names it ("90"), or None (no GPU)."""
    cap = smi("compute_cap")
    return cap.replace(".", "") if cap else None


def build(src: Path, work: Path, jobs: int) -> tuple[Path, str]:
    """llama-bench and llama-quantize built in work/build (kept between runs); (their
    folder, what they run on)."""
    arch = gpu_arch() if shutil.which("nvcc") else None
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF"]
    flags += ["-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
    flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"] if arch else []
    out = work / "build"
    bins = out / "bin"
    if not all((bins / t).exists() for t in TARGETS):
        subprocess.run(["cmake", "-S", str(src), "-B", str(out), *flags], check=True)
        cmd = ["cmake", "--build", str(out), "-j", str(jobs), "--target", *TARGETS]
        subprocess.run(cmd, check=True)
    return bins, f"CUDA sm_{arch}" if arch else "CPU"


# Run in a child process with llama.cpp's gguf-py and converter on its path: the converter
# as its own command line runs it, with the model's tokenizer read from the vocabulary file.
_CONVERT = r"""
import sys
from pathlib import Path
src, model, out, vocab = sys.argv[1:5]
sys.path[:0] = [src, str(Path(src) / "gguf-py")]
import gguf
import convert_hf_to_gguf as convert
from conversion.qwen import Qwen3_5TextModel

def set_vocab(self):
    fields = gguf.GGUFReader(vocab).fields
    tokens = list(fields["tokenizer.ggml.tokens"].contents())
    types = list(fields["tokenizer.ggml.token_type"].contents())
    size = self.hparams.get("vocab_size", len(tokens))
    tokens += [f"[PAD{i}]" for i in range(len(tokens), size)]
    types += [gguf.TokenType.UNUSED] * (size - len(types))
    w = self.gguf_writer
    w.add_tokenizer_model(fields["tokenizer.ggml.model"].contents())
    w.add_tokenizer_pre(fields["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens[:size])
    w.add_token_types(types[:size])
    w.add_token_merges(list(fields["tokenizer.ggml.merges"].contents()))
    w.add_eos_token_id(int(fields["tokenizer.ggml.eos_token_id"].contents()))
    w.add_bos_token_id(int(fields["tokenizer.ggml.bos_token_id"].contents()))

Qwen3_5TextModel.set_vocab = set_vocab
sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, "--outtype", "bf16"]
convert.main()
"""


def convert(src: Path, model: Path, out: Path) -> None:
    cmd = [sys.executable, "-c", _CONVERT, str(src), str(model), str(out), str(src / VOCAB)]
    subprocess.run(cmd, check=True)


def bench(bins: Path, gguf: Path, prompts: list[int], gen: int, reps: int) -> list[dict]:
    """llama-bench's JSON rows: each prompt length alone (-n 0), then a decode of `gen`
    tokens (-p 0)."""
    cmd = [str(bins / "llama-bench"), "-m", str(gguf), "-ngl", "99", "-fa", "1"]
    cmd += ["-p", ",".join(map(str, prompts)), "-n", str(gen), "-r", str(reps), "-o", "json"]
    got = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(got.stdout)


def table(rows: list[dict], meta: dict) -> str:
    lines = [
        f"llama.cpp ({meta['backend']}, {meta['quant']}, flash attention) on {meta['gpu']}: "
        f"{meta['shape']} random weights; {meta['date']}",
        "",
        "| test | tokens/s | time |",
        "| --- | --- | --- |",
    ]
    for r in rows:
        n_p, n_g, ts = r["n_prompt"], r["n_gen"], r["avg_ts"]
        if n_p:
            lines.append(f"| prompt of {n_p:,} | {ts:,.0f} | first token {n_p / ts:.3f} s |")
        else:
            lines.append(f"| decode of {n_g} | {ts:,.1f} | {1e3 / ts:.2f} ms a token |")
    return "\n".join(lines)


def run_bench(args: argparse.Namespace) -> None:
    from engine.testing.synth import model_dir

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    src = work / "llama.cpp"
    if not src.exists():
        with tarfile.open(args.src) as tar:
            tar.extractall(work, filter="data")
    bins, backend = build(src, work, args.jobs)
    model = model_dir(work, args.shape, "bf16")
    q4 = work / f"{args.shape}-q4_0.gguf"
    if not q4.exists():
        bf16 = work / f"{args.shape}-bf16.gguf"
        convert(src, model, bf16)
        subprocess.run([str(bins / "llama-quantize"), str(bf16), str(q4), "Q4_0"], check=True)
        bf16.unlink()
    if args.prepare_only:  # built and converted; a later run times it
        print(f"ready: {bins} ({backend}), {q4}")
        return
    prompts = [int(p) for p in args.prompts.split(",")]
    rows = bench(bins, q4, prompts, args.decode_tokens, args.reps)
    gpu = smi("name") if backend != "CPU" else "the CPU"
    meta = {
        "shape": args.shape,
        "quant": "Q4_0",
        "backend": backend,
        "gpu": gpu or "unknown",
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(args.commit),
    }
    print(table(rows, meta))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keep = ("n_prompt", "n_gen", "avg_ts", "stddev_ts", "avg_ns", "build_commit", "n_gpu_layers")
    data = {**meta, "rows": [{k: r.get(k) for k in keep} for r in rows]}
    (out / "llamacpp.json").write_text(json.dumps(data, indent=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="the trimmed llama.cpp sources as a tar.gz")
    p.add_argument("--sdist", type=Path, help="a llama-cpp-python .tar.gz (default: pip)")
    p.add_argument("--out", type=Path, default=REPO / ".llama-src.tgz")
    b = sub.add_parser("bench", help="build, convert, quantize and time")
    b.add_argument("--src", type=Path, default=REPO / ".llama-src.tgz")
    b.add_argument("--shape", default="4B")
    b.add_argument("--prompts", default="512,8000")
    b.add_argument("--decode-tokens", type=int, default=128)
    b.add_argument("--reps", type=int, default=3)
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    b.add_argument("--workdir", default="/tmp/llamacpp")
    b.add_argument("--prepare-only", action="store_true", help="build and convert, time nothing")
    b.add_argument("--out", default=".")
    b.add_argument("--commit", default="unknown", help="Snug's tree, for the record")
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        pack(args.sdist, args.out)
    else:
        run_bench(args)


if __name__ == "__main__":
    main()
