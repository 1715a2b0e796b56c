"""Start-up against hostile files: corrupt chats, bad settings, bad SNUG_* variables, chat ids
that point outside the chats folder. None of them may stop the app; each is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from app.state.chat_history import Chat, ChatFileError
from app.state.chat_store import ChatStore
from app.state.settings import BY_KEY, AppSettings

ROOT = Path(__file__).resolve().parents[2]
BIG = "1" * 400  # a 400-digit integer: json reads it, float() of it overflows
DEEP = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError

CORRUPT_CHATS = {
    "list.json": "[]",
    "null.json": "null",
    "number.json": "1",
    "deep.json": DEEP,
    "huge.json": '{"id": "huge", "created": ' + BIG + "}",
    "turns.json": '{"id": "turns", "turns": "not a list"}',
    "role.json": '{"id": "role", "turns": [{"role": "system", "content": "x"}]}',
    "stats.json": '{"id": "stats", "turns": [{"role": "user", "content": "x", '
    '"stats": {"decode_tok_s": "fast"}}]}',
    "surrogate.json": '{"id": "surrogate", "title": "\\ud800"}',
    "nan.json": '{"id": "nan", "updated": NaN}',
    "other-name.json": '{"id": "someone-else"}',
}


def _valid(chat_id: str) -> str:
    return json.dumps(
        {"id": chat_id, "title": "kept", "turns": [{"role": "user", "content": "hi"}]}
    )


# --- finding 3: corrupt chat files and settings never stop the start ----------------------


def test_app_starts_with_corrupt_chats_bad_settings_and_a_bad_env_var(tmp_path):
    """The probe's cases, end to end in a child process (on failure Qt aborts the process)."""
    chats = tmp_path / "chats"
    chats.mkdir()
    for name, text in CORRUPT_CHATS.items():
        (chats / name).write_text(text, encoding="utf-8")
    (chats / "good.json").write_text(_valid("good"), encoding="utf-8")
    before = {p.name: p.read_bytes() for p in chats.iterdir()}
    child = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from PySide6.QtCore import QSettings
        from app.main import make_app, show_problems
        from app.context import build_context
        from app.main_window import MainWindow

        class NoGpu:
            def open(self):
                raise OSError("no GPU in this test")
            def read(self):
                raise AssertionError
            def close(self):
                pass

        tmp = Path(sys.argv[1])
        app = make_app([sys.argv[0]])
        out = []
        for value in ("nan", "inf", "-1"):
            ini = tmp / f"Snug-{value}.conf"
            ini.write_text(f"[memory]\\nreserve_gib={value}\\n")
            store = QSettings(str(ini), QSettings.Format.IniFormat)
            ctx = build_context(store=store, chats_dir=tmp / "chats", gpu_source=NoGpu,
                                cache_dir=str(tmp / "hub"))
            window = MainWindow(ctx)
            show_problems(window, ctx.problems)
            out.append({"problems": ctx.problems, "status": window.statusBar().currentMessage(),
                        "reserve": ctx.machine.reserve_bytes,
                        "chats": sorted(c.id for c in ctx.chats.store.chats())})
            window.close()
            ctx.shutdown()
        print(json.dumps(out))
        """
    )
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "SNUG_BACKEND": "foo"}
    env["HF_HOME"] = str(tmp_path / "hf")
    run = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    for value, result in zip(("nan", "inf", "-1"), results, strict=True):
        text = "\n".join(result["problems"])
        assert f"memory/reserve_gib = '{value}'" in text and "default 0.5" in text
        assert "SNUG_BACKEND" in text and "'foo'" in text
        for name in CORRUPT_CHATS:
            assert name in text, name
        assert result["status"].startswith(result["problems"][0])
        assert result["reserve"] == 1 << 29  # the default 0.5 GiB
        assert "good" in result["chats"]
    after = {p.name: p.read_bytes() for p in chats.iterdir() if p.name in before}
    assert after == before  # skipped files are never written over


@pytest.mark.parametrize("name", sorted(CORRUPT_CHATS))
def test_each_corrupt_chat_file_is_skipped_reported_and_left_as_it_is(chats_dir, name, caplog):
    path = chats_dir / name
    path.write_text(CORRUPT_CHATS[name], encoding="utf-8")
    (chats_dir / "good.json").write_text(_valid("good"), encoding="utf-8")
    store = ChatStore(chats_dir)
    assert [c.id for c in store.chats()] == ["good"]
    assert len(store.problems) == 1 and name in store.problems[0]
    assert name in caplog.text
    for _ in range(3):
        store.create()
    store.save(store.get("good"))
    assert path.read_text(encoding="utf-8") == CORRUPT_CHATS[name]


@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("memory/reserve_gib", "nan"),
        ("memory/reserve_gib", "inf"),
        ("memory/reserve_gib", "-1"),
        ("memory/limit_gib", "1e400"),
        ("engine/context", BIG),
        ("engine/context", "8192.5"),
        ("engine/streams", "0"),
        ("engine/backend", "foo"),
        ("engine/refuse_cpu", "maybe"),
        ("sampling/top_p", "2"),
    ],
)
def test_a_bad_setting_falls_back_to_its_default_with_a_warning(tmp_path, key, raw, caplog):
    ini = tmp_path / "Snug.conf"
    group, name = key.split("/")
    ini.write_text(f"[{group}]\n{name}={raw}\n", encoding="utf-8")
    settings = AppSettings(QSettings(str(ini), QSettings.Format.IniFormat))
    default = BY_KEY[key].default
    assert settings.get(key) == default
    assert len(settings.problems) == 1
    problem = settings.problems[0]
    assert key in problem and f"default {default!r}" in problem
    assert (raw if len(raw) < 20 else raw[:10]) in problem
    assert problem in caplog.text
    es = settings.engine_settings()
    assert es.reserve_bytes >= 0 and settings.sampling()["top_p"] <= 1


def test_invalid_snug_variables_are_named_and_ignored(app_settings, monkeypatch):
    monkeypatch.setenv("SNUG_BACKEND", "foo")
    monkeypatch.setenv("SNUG_MEMORY_LIMIT_GIB", "-2")
    monkeypatch.setenv("SNUG_COMPUTE_DTYPE", "float16")  # valid: still passes through
    es = app_settings.engine_settings()
    assert es.compute_dtype == "float16" and es.limit_bytes is None
    text = "\n".join(app_settings.problems)
    assert "SNUG_BACKEND" in text and "'foo'" in text and "SNUG_MEMORY_LIMIT_GIB" in text
    assert "SNUG_COMPUTE_DTYPE" not in text


def test_setting_a_value_the_setting_cannot_hold_is_refused_by_name(app_settings):
    with pytest.raises(ValueError, match="memory/reserve_gib"):
        app_settings.set("memory/reserve_gib", float("nan"))
    assert app_settings.get("memory/reserve_gib") == 0.5


# --- finding 4: chat ids never reach outside the chats folder ----------------------------


def test_a_chat_id_with_dot_dots_is_refused_and_delete_stays_in_the_folder(tmp_path):
    chats = tmp_path / "chats"
    chats.mkdir()
    victim = tmp_path / "victim.json"
    victim.write_text("precious", encoding="utf-8")
    (chats / "evil.json").write_text(json.dumps({"id": "../victim"}), encoding="utf-8")
    store = ChatStore(chats)
    assert store.chats() == [] and "evil.json" in store.problems[0]
    store.delete("../victim")
    assert victim.read_text(encoding="utf-8") == "precious"
    assert (chats / "evil.json").exists()


def test_saving_a_chat_with_a_traversal_id_writes_nothing_outside(tmp_path):
    chats = tmp_path / "a" / "chats"
    chats.mkdir(parents=True)
    store = ChatStore(chats)
    for bad in ("../../planted", "/tmp/planted", "..", "a/b", "", "x" * 65, "a.b"):
        with pytest.raises(ChatFileError):
            store.save(Chat(id=bad))
    assert not [p for p in tmp_path.rglob("*") if "planted" in p.name]
    assert sorted(p.name for p in chats.iterdir()) == []


def test_new_chats_never_take_the_name_of_a_skipped_file(chats_dir, monkeypatch):
    (chats_dir / "aaaaaaaaaaaa.json").write_text("null", encoding="utf-8")
    ids = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr(Chat, "new", classmethod(lambda cls: cls(id=next(ids))))
    store = ChatStore(chats_dir)
    assert store.create().id == "bbbbbbbbbbbb"
    assert (chats_dir / "aaaaaaaaaaaa.json").read_text(encoding="utf-8") == "null"


# --- a long-time user's files: cut short, a folder, a dead link, a newer version's -------


def test_unusable_chat_files_are_named_with_what_to_do_and_the_rest_load(chats_dir):
    whole = _valid("cut")
    (chats_dir / "cut.json").write_text(whole[: len(whole) // 2], encoding="utf-8")
    (chats_dir / "empty.json").write_bytes(b"")
    (chats_dir / "folder.json").mkdir()
    (chats_dir / "gone.json").symlink_to(chats_dir / "nowhere.json")
    (chats_dir / "good.json").write_text(_valid("good"), encoding="utf-8")
    store = ChatStore(chats_dir)
    assert [c.id for c in store.chats()] == ["good"]
    said = {p.split(":")[0].removeprefix("Skipped chat file "): p for p in store.problems}
    assert sorted(said) == ["cut.json", "empty.json", "folder.json", "gone.json"]
    assert "cut short" in said["cut.json"] and "empty" in said["empty.json"]
    assert "folder" in said["folder.json"] and "not there" in said["gone.json"]
    for problem in said.values():
        assert str(chats_dir) in problem and "move it out" in problem  # what to do
    store.create()
    assert (chats_dir / "cut.json").read_text(encoding="utf-8") == whole[: len(whole) // 2]
    assert (chats_dir / "gone.json").is_symlink() and (chats_dir / "folder.json").is_dir()


def test_a_newer_versions_fields_are_kept_when_the_chat_is_saved(chats_dir):
    raw = json.loads(_valid("newer"))
    raw["pinned"] = True
    raw["turns"][0]["reactions"] = ["+1"]
    (chats_dir / "newer.json").write_text(json.dumps(raw), encoding="utf-8")
    store = ChatStore(chats_dir)
    chat = store.get("newer")
    assert store.problems == [] and chat is not None and chat.turns[0].content == "hi"
    store.save(chat)
    saved = json.loads((chats_dir / "newer.json").read_text(encoding="utf-8"))
    assert saved["pinned"] is True and saved["turns"][0]["reactions"] == ["+1"]


def test_a_save_cut_short_leaves_the_last_whole_file_and_is_cleared_up(chats_dir):
    (chats_dir / "good.json").write_text(_valid("good"), encoding="utf-8")
    (chats_dir / "good.tmp").write_text(_valid("good")[:20], encoding="utf-8")  # cut short
    newer = json.loads(_valid("later"))
    (chats_dir / "later.json").write_text(json.dumps({**newer, "updated": 1.0}), "utf-8")
    (chats_dir / "later.tmp").write_text(json.dumps({**newer, "updated": 2.0}), "utf-8")
    (chats_dir / "first.tmp").write_text(_valid("first"), encoding="utf-8")  # never renamed
    store = ChatStore(chats_dir)
    assert sorted(c.id for c in store.chats()) == ["first", "good", "later"]
    assert store.get("later").updated == 2.0  # the whole newer save, finished
    assert store.problems == [] and not list(chats_dir.glob("*.tmp"))


def test_a_full_disk_keeps_the_chat_says_what_to_do_and_saves_once_there_is_room(
    qtbot, make_window, chats_dir, monkeypatch
):
    import errno
    import os

    from fake_engine import FakeEngine

    from app.engine_bridge import LoadRequest

    window = make_window(loader=FakeEngine.loader())
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    chats = window.ctx.chats
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("First question")
    path = chats_dir / f"{chats.current.id}.json"
    before = path.read_bytes()
    real_replace = os.replace

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("Second question")
    qtbot.waitUntil(lambda: not chats.busy, timeout=3000)
    status = window.chat.status.text()
    assert str(path) in status and "No space left" in status and "free some disk" in status
    assert [t.content for t in chats.current.turns if t.role == "user"] == [
        "First question",
        "Second question",
    ]  # the chat on screen is whole
    assert len(window.chat.message_widgets()) == 4
    assert path.read_bytes() == before and not list(chats_dir.glob("*.tmp"))
    assert window.chat.send_button.isEnabled()  # not stuck generating
    monkeypatch.setattr(os, "replace", real_replace)  # room again
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("Third question")
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert [t["content"] for t in saved["turns"] if t["role"] == "user"] == [
        "First question",
        "Second question",
        "Third question",
    ]
    assert chats.store.unsaved == set()
