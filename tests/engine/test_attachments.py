"""Files attached to a message (engine/attachments.py): what is read of them, what is
refused by name, and how they are written into the message the model reads."""

from __future__ import annotations

import codecs
import io
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.attachments import (
    MAX_FILE_BYTES,
    Attachment,
    AttachmentRefused,
    compose,
    file_text,
    read_attachment,
)
from engine.testing.documents import text_pdf


def refusal(name: str, data: bytes) -> str:
    with pytest.raises(AttachmentRefused) as caught:
        file_text(name, data)
    assert name in str(caught.value)
    return str(caught.value)


def test_text_files_are_read_as_text(tmp_path):
    path = tmp_path / "notes.md"
    path.write_bytes("# Plan\r\nbuy milk\r\nnaïve café\r\n".encode())
    got = read_attachment(path)
    assert got == Attachment("notes.md", "# Plan\nbuy milk\nnaïve café\n")
    assert got.lines == 3 and got.summary() == "notes.md, 3 lines"
    assert file_text("bom.txt", codecs.BOM_UTF8 + b"x = 1") == "x = 1"
    utf16 = codecs.BOM_UTF16_LE + "Grüße\n".encode("utf-16-le")
    assert file_text("windows.txt", utf16) == "Grüße\n"
    assert Attachment("one.txt", "one line").summary() == "one.txt, 1 line"


def test_files_the_model_cannot_read_are_refused_by_name(tmp_path):
    assert "a PNG image" in refusal("photo.png", b"\x89PNG\r\n\x1a\n" + bytes(100))
    assert "a JPEG image" in refusal("photo.jpg", b"\xff\xd8\xff\xe0" + bytes(100))
    assert "a WebP image" in refusal("photo.webp", b"RIFF\x00\x00\x00\x00WEBPVP8 ")
    assert "ZIP" in refusal("slides.pptx", b"PK\x03\x04" + bytes(40))
    assert "a binary file" in refusal("model.bin", b"\x01\x02\x00\x03" * 10)
    latin = refusal("old.txt", "café".encode("latin-1"))
    assert "not UTF-8" in latin and "0xe9" in latin and "offset 3" in latin
    big = refusal("huge.log", b"a" * (MAX_FILE_BYTES + 1))
    assert "MiB" in big and "part you need" in big
    huge = tmp_path / "huge.log"
    huge.write_bytes(b"a" * (MAX_FILE_BYTES + 1))
    with pytest.raises(AttachmentRefused, match="huge.log is 4.0 MiB"):
        read_attachment(huge)  # read no further than the limit
    with pytest.raises(AttachmentRefused, match="folder"):
        read_attachment(tmp_path)
    with pytest.raises(AttachmentRefused, match="missing.txt could not be read") as err:
        read_attachment(tmp_path / "missing.txt")
    assert str(tmp_path / "missing.txt") in str(err.value)  # where it was looked for


def test_a_pdf_gives_its_text_layer_page_by_page():
    assert file_text("one.pdf", text_pdf(["Only (page) here"])) == "Only (page) here\n"
    text = file_text("three.pdf", text_pdf(["First page", "", "Third page"]))
    assert re.findall(r"\[page (\d)\]", text) == ["1", "2", "3"]
    assert text.index("First page") < text.index("[page 2]") < text.index("Third page")


def test_pdfs_without_text_or_behind_a_password_are_refused_by_name():
    import pypdf

    assert "no text layer" in refusal("scan.pdf", text_pdf(["", ""]))
    assert "not a readable PDF" in refusal("cut.pdf", text_pdf(["Some text"])[:150])

    def encrypted(user: str) -> bytes:
        writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(text_pdf(["Secret"]))))
        writer.encrypt(user, owner_password="owner")
        out = io.BytesIO()
        writer.write(out)
        return out.getvalue()

    assert "password" in refusal("locked.pdf", encrypted("hunter2"))
    assert file_text("open.pdf", encrypted("")) == "Secret\n"  # opens without a password


def test_the_message_holds_each_file_fenced_under_its_name_then_the_text():
    notes = Attachment("notes.md", "a\nb\n")
    code = Attachment("run.py", "print('```')")  # a fence inside: the block's is longer
    got = compose("What do these do?", [notes, code])
    assert got == (
        "File: notes.md\n```markdown\na\nb\n```\n\n"
        "File: run.py\n````python\nprint('```')\n````\n\n"
        "What do these do?"
    )
    assert compose("", [notes]) == "File: notes.md\n```markdown\na\nb\n```"
    assert compose("just text", []) == "just text"


@given(st.text(alphabet=st.sampled_from("`a\n "), max_size=60))
def test_a_files_text_comes_back_whole_from_its_block(text):
    block = compose("", [Attachment("f.txt", text)])
    head, _, rest = block.partition("\n")
    fence = rest.split("\n", 1)[0]
    assert head == "File: f.txt" and set(fence) == {"`"} and len(fence) >= 3
    inner = rest[len(fence) + 1 :]
    body = inner[: -len(fence)]
    assert inner.endswith(fence) and body == (text if text.endswith("\n") else text + "\n")
    closing = [line for line in body.split("\n") if line.strip().startswith(fence)]
    assert not closing  # CommonMark: no line inside may close the block


def word(build) -> bytes:
    import docx

    document = docx.Document()
    build(document)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_a_word_document_gives_its_paragraphs_and_tables_in_order():
    def build(d):
        d.add_heading("Launch plan", 1)
        d.add_paragraph("Ship the 4 GiB build.")
        table = d.add_table(rows=2, cols=2)
        for (r, c), text in {(0, 0): "who", (0, 1): "what", (1, 0): "Ann", (1, 1): "tests"}.items():
            table.cell(r, c).text = text
        d.add_paragraph("Then the release notes.")

    text = file_text("plan.docx", word(build))
    assert text == (
        "Launch plan\nShip the 4 GiB build.\n| who | what |\n| Ann | tests |\n"
        "Then the release notes.\n"
    )
    assert "holds no text" in refusal("blank.docx", word(lambda d: None))
    whole = word(build)
    assert "not a readable Word document" in refusal("cut.docx", whole[: len(whole) // 2])
    assert "other than Word's .docx" in refusal("sheet.xlsx", whole)  # a zip, not read as Word
