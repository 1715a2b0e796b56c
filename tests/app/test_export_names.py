"""Export as Markdown: a name typed without an extension, with the Markdown filter chosen,
is saved as a .md file (as the dialog's filter says); one with "All files" chosen is kept as
typed; a file that cannot be written says why and what to do."""

from __future__ import annotations

from fake_engine import FakeEngine
from PySide6.QtWidgets import QFileDialog

from app.engine_bridge import LoadRequest


def test_an_export_takes_the_extension_its_filter_names(qtbot, make_window, monkeypatch, tmp_path):
    window = make_window(loader=FakeEngine.loader())
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    window.close_welcome()
    chats = window.ctx.chats
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("Notes for the trip")
    answer: list[tuple[str, str]] = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args: answer.pop(0))

    answer.append((str(tmp_path / "trip"), "Markdown (*.md)"))
    window.sidebar.export(chats.current.id)
    assert (tmp_path / "trip.md").read_text(encoding="utf-8").startswith("# Notes for the trip")
    assert not (tmp_path / "trip").exists()
    assert window.chat.status.text() == f"Chat exported to {tmp_path / 'trip.md'}"

    answer.append((str(tmp_path / "trip.markdown"), "Markdown (*.md)"))  # its own extension
    window.sidebar.export(chats.current.id)
    assert (tmp_path / "trip.markdown").exists() and not (tmp_path / "trip.markdown.md").exists()

    answer.append((str(tmp_path / "README"), "All files (*)"))  # as typed
    window.sidebar.export(chats.current.id)
    assert (tmp_path / "README").exists() and not (tmp_path / "README.md").exists()

    (tmp_path / "taken.md").mkdir()  # a folder of that name: the write fails
    answer.append((str(tmp_path / "taken"), "Markdown (*.md)"))
    window.sidebar.export(chats.current.id)
    said = window.chat.status.text()
    assert said.startswith(f"Could not export the chat to {tmp_path / 'taken.md'}")
    assert "choose another" in said.lower()


def test_a_md_file_the_dialog_did_not_ask_about_is_replaced_only_when_told(
    qtbot, make_window, monkeypatch, tmp_path
):
    from helpers import answer_next_dialog

    window = make_window()
    window.close_welcome()
    chats = window.ctx.chats
    chats.store.rename(chats.current.id, "Kept notes")
    (tmp_path / "notes.md").write_text("written before\n", encoding="utf-8")
    monkeypatch.setattr(
        QFileDialog, "getSaveFileName", lambda *args: (str(tmp_path / "notes"), "Markdown (*.md)")
    )
    seen: list[str] = []
    answer_next_dialog("No", seen)
    window.sidebar.export(chats.current.id)
    assert any("notes.md already exists" in s for s in seen)
    assert (tmp_path / "notes.md").read_text(encoding="utf-8") == "written before\n"
    answer_next_dialog("Yes", seen)
    window.sidebar.export(chats.current.id)
    assert (tmp_path / "notes.md").read_text(encoding="utf-8").startswith("# Kept notes")
