"""Fixtures for the GUI tests: temp settings, temp chat folder, temp HF cache, fake engine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).parent))
# tests/engine has no __init__.py, so with tests/ on sys.path `import engine` could resolve to
# that folder as a namespace package; the repository root goes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


@pytest.fixture(scope="session", autouse=True)
def prompt_cache_dir(tmp_path_factory):
    """The engine's saved prompt states go to a temp folder, not the user's data folder
    (AppSettings.engine_settings puts them there unless SNUG_PROMPT_CACHE_DIR says)."""
    path = tmp_path_factory.mktemp("prompt-cache")
    old = os.environ.get("SNUG_PROMPT_CACHE_DIR")
    os.environ["SNUG_PROMPT_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("SNUG_PROMPT_CACHE_DIR", None)
    else:
        os.environ["SNUG_PROMPT_CACHE_DIR"] = old


@pytest.fixture
def settings_store(tmp_path):
    from PySide6.QtCore import QSettings

    return QSettings(str(tmp_path / "snug.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def app_settings(settings_store):
    from app.state.settings import AppSettings

    return AppSettings(settings_store)


@pytest.fixture
def chats_dir(tmp_path):
    path = tmp_path / "chats"
    path.mkdir()
    return path


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """A private HF cache for the test (huggingface_hub reads the module constants)."""
    from huggingface_hub import constants

    home = tmp_path / "hf"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HUGGINGFACE_HUB_CACHE", str(cache), raising=False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True, raising=False)
    # Small chunks, so that a cut or a Cancel lands mid-file on a 3 MiB test file.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 << 10)
    return cache


class NoGpu:
    """An NVML source for tests: behaves like a machine without an NVIDIA driver."""

    def open(self):
        import pynvml

        pynvml.nvmlInit()  # raises NVMLError_LibraryNotFound here (no driver)

    def read(self):
        raise AssertionError("not opened")

    def close(self):
        pass


class FakeGpu:
    """An 8 GiB card with 1 GiB used by other programs."""

    def open(self):
        pass

    def read(self):
        total = 8 << 30
        return {
            "name": "Test GPU",
            "total": total,
            "used": 1 << 30,
            "free": total - (1 << 30),
            "ours": 0,
        }

    def close(self):
        pass


@pytest.fixture
def make_window(qtbot, settings_store, chats_dir, hf_home):
    """Builds a MainWindow on a fresh context; every window is shut down after the test."""
    from app.context import build_context
    from app.main_window import MainWindow

    windows = []

    def make(loader=None, gpu_source=NoGpu, store=None, planner=None):
        ctx = build_context(
            store=store or settings_store,
            chats_dir=chats_dir,
            loader=loader,
            gpu_source=gpu_source,
            cache_dir=str(hf_home),
            planner=planner,
        )
        window = MainWindow(ctx)
        qtbot.addWidget(window)
        window.resize(1280, 800)
        window.show()
        windows.append(window)
        return window

    yield make
    for window in windows:
        window.close()


@pytest.fixture
def tiny(tiny_checkpoint):
    """The default tiny checkpoint (tests/conftest.py), skipped where it cannot be built."""
    try:
        return tiny_checkpoint()
    except ImportError as exc:  # the builder needs transformers
        pytest.skip(f"cannot build a tiny checkpoint here: {exc}")
