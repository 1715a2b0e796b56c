"""tools/llamacpp.py without building llama.cpp: what `pack` keeps of a source distribution
and the table `bench` prints from llama-bench's JSON. The build, conversion and timing run
on a GPU machine (the tool's docstring)."""

from __future__ import annotations

import io
import tarfile

from tools.llamacpp import VOCAB, pack, table


def _sdist(path, names: list[str]) -> None:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            data = name.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-9.9/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_pack_keeps_the_sources_and_the_qwen35_vocabulary(tmp_path):
    v = "vendor/llama.cpp/"
    names = [v + n for n in ("CMakeLists.txt", "ggml/src/ggml.c", VOCAB, "convert_hf_to_gguf.py")]
    # a name past ustar's 100 characters travels in a PAX header, as the CUDA instances do
    names.append(v + "ggml/src/ggml-cuda/template-instances/fattn-vec-instance-f16-f16.cu")
    dropped = [v + n for n in ("models/ggml-vocab-llama-bpe.gguf", ".git/HEAD", "docs/x.md")]
    _sdist(tmp_path / "s.tar.gz", [*names, *dropped, "llama_cpp/__init__.py"])
    pack(tmp_path / "s.tar.gz", tmp_path / "out.tgz")
    with tarfile.open(tmp_path / "out.tgz") as tar:
        kept = sorted(tar.getnames())
    assert kept == sorted("llama.cpp/" + n[len(v) :] for n in names)


def test_the_table_gives_first_token_times_and_the_decode_rate():
    rows = [
        {"n_prompt": 8000, "n_gen": 0, "avg_ts": 16000.0},
        {"n_prompt": 0, "n_gen": 128, "avg_ts": 310.0},
    ]
    meta = {"backend": "CUDA sm_90", "quant": "Q4_0", "gpu": "a GPU", "shape": "4B", "date": "d"}
    text = table(rows, meta)
    assert "| prompt of 8,000 | 16,000 | first token 0.500 s |" in text
    assert "| decode of 128 | 310.0 | 3.23 ms a token |" in text
