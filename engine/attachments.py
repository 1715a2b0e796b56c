"""Files attached to a chat message (the app's Attach button or a file dropped on the chat,
`snug chat`'s /attach): read with checks, and written into the message the model reads.

A file's text goes into the user's message before what they typed, each file in a fenced
Markdown block under its name. The fence is longer than any run of backticks inside the
file (as CommonMark asks), so the model sees where each file starts and ends, and an
exported chat shows it as code. Text files (UTF-8, or UTF-16 with its byte-order mark) are
taken as they are; a PDF gives its text layer, page by page (pypdf); a Word document
(.docx) its paragraphs and tables in order (python-docx). Images and other binary files
are refused by name: Qwen3.5's language model reads text only (its vision
tower is not loaded). What a file costs in tokens is the context's business: a message
too long for the loaded context is refused by name when sent (engine/context_fit.py).
"""

from __future__ import annotations

import base64
import binascii
import codecs
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import SnugError

MAX_TEXT_CHARS = 1 << 20  # about 250,000 tokens: more than any context Snug loads
MAX_PDF_BYTES = 64 << 20  # a PDF's or a Word document's bytes (images inside take most)
MAX_FILE_BYTES = 4 * MAX_TEXT_CHARS  # a text file's bytes (UTF-8 takes up to 4 a character)
IMAGES = {  # leading bytes of the image formats people try to attach
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"BM": "a BMP image",
}
LANGUAGES = {  # a fence's info string by suffix, for the exported chat's highlighting
    ".py": "python",
    ".js": "javascript",
    ".ts": "typescript",
    ".sh": "bash",
    ".md": "markdown",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".toml": "toml",
    ".html": "html",
    ".css": "css",
    ".c": "c",
    ".h": "c",
    ".cpp": "cpp",
    ".cu": "cuda",
    ".rs": "rust",
    ".go": "go",
    ".java": "java",
    ".sql": "sql",
    ".csv": "csv",
    ".xml": "xml",
}


class AttachmentRefused(SnugError):
    """A file that cannot go into a message: too large, not text, unreadable. The message
    names the file and what to do instead."""


@dataclass(frozen=True)
class Attachment:
    """A file's name (without its folder) and the text the model reads of it."""

    name: str
    text: str

    @property
    def lines(self) -> int:
        return self.text.count("\n") + (not self.text.endswith("\n") and bool(self.text))

    def summary(self) -> str:
        """'notes.md, 120 lines'."""
        n = self.lines
        return f"{self.name}, {n:,} line{'' if n == 1 else 's'}"


def read_attachment(path: str | Path) -> Attachment:
    """The file at `path` as an Attachment; AttachmentRefused, naming it, for a folder, a
    file too large, a binary file or one that cannot be read."""
    path = Path(path)
    name = path.name or str(path)
    try:
        if path.is_dir():
            raise AttachmentRefused(f"{name} is a folder: attach the files in it one by one")
        with path.open("rb") as f:  # no more than the limit is read, plus a byte to know
            head = f.read(5)
            document = head == b"%PDF-" or _is_docx(name, head)
            limit = MAX_PDF_BYTES if document else MAX_FILE_BYTES
            data = head + f.read(limit + 1 - len(head))
    except OSError as exc:
        # The whole path: the name alone does not say where it was looked for.
        raise AttachmentRefused(f"{path} could not be read: {exc.strerror or exc}") from None
    return Attachment(name, file_text(name, data))


def sent_file(name: str, data: str) -> Attachment:
    """A file sent inside an API request (OpenAI's `file` part, the Responses API's
    `input_file`, the Messages API's `document`): `data` is base64, or a data URL
    ('data:application/pdf;base64,...')."""
    if data.startswith("data:"):
        head, comma, data = data.partition(",")
        if not comma or not head.endswith(";base64"):
            raise AttachmentRefused(f"{name}: a data URL here must be 'data:TYPE;base64,...'")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise AttachmentRefused(f"{name}: its data is not base64") from None
    return Attachment(name, file_text(name, raw))


def file_text(name: str, data: bytes) -> str:
    """The text of a file called `name` whose bytes are `data` (see the module's note)."""
    if data.startswith(b"%PDF-"):
        return _pdf_text(name, data)
    if _is_docx(name, data):
        return _docx_text(name, data)
    if len(data) > MAX_FILE_BYTES:
        raise AttachmentRefused(
            f"{name} is {_size(len(data))}; a text file attached to a message may take up to "
            f"{_size(MAX_FILE_BYTES)} (about 250,000 tokens, more than the context holds). "
            "Attach the part you need, or paste it"
        )
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        text = _decode(name, data, "utf-16")
    else:
        kind = _binary_kind(data)
        if kind:
            raise AttachmentRefused(
                f"{name} is {kind}, not text: the model reads text only. Attach a text file "
                "(notes, source code, Markdown, CSV), a PDF with a text layer or a Word "
                "document (.docx)"
            )
        text = _decode(name, data, "utf-8-sig")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _bounded(name, text)


def compose(text: str, attachments: Iterable[Attachment]) -> str:
    """The message the model reads: each file fenced under its name, then `text`."""
    parts = [_fenced(a) for a in attachments]
    if text:
        parts.append(text)
    return "\n\n".join(parts)


def _fenced(attachment: Attachment) -> str:
    longest = max((len(run) for run in re.findall(r"`+", attachment.text)), default=0)
    fence = "`" * max(3, longest + 1)
    language = LANGUAGES.get(Path(attachment.name).suffix.lower(), "")
    body = attachment.text if attachment.text.endswith("\n") else attachment.text + "\n"
    return f"File: {attachment.name}\n{fence}{language}\n{body}{fence}"


def _decode(name: str, data: bytes, encoding: str) -> str:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise AttachmentRefused(
            f"{name} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start:,}): "
            "save it as UTF-8 and attach it again"
        ) from None


def _binary_kind(data: bytes) -> str:
    head = data[:16]
    for magic, kind in IMAGES.items():
        if head.startswith(magic):
            return kind
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "a WebP image"
    if head.startswith(b"PK\x03\x04"):
        return "a ZIP archive (or an Office document other than Word's .docx)"
    return "a binary file" if b"\x00" in data[:8192] else ""


def _pdf_text(name: str, data: bytes) -> str:
    """A PDF's text layer, each page after a '[page N]' line (pypdf)."""
    if len(data) > MAX_PDF_BYTES:
        raise AttachmentRefused(
            f"{name} is over {_size(MAX_PDF_BYTES)}; attach a PDF of the pages you need"
        )
    import pypdf  # imported here: only a PDF needs it

    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise AttachmentRefused(f"{name} is protected by a password: save it unprotected")
        pages = [page.extract_text() or "" for page in reader.pages]
    except AttachmentRefused:
        raise
    except Exception as e:  # noqa: BLE001 (a damaged file reaches pypdf's parser as any error)
        raise AttachmentRefused(f"{name} is not a readable PDF ({type(e).__name__}: {e})") from None
    if not any(p.strip() for p in pages):
        raise AttachmentRefused(
            f"{name} has no text layer (a scan or pictures of pages): the model reads text "
            "only. Run it through OCR first, or paste its text"
        )
    if len(pages) == 1:
        return _bounded(name, pages[0].strip() + "\n")
    text = "\n\n".join(f"[page {i}]\n{p.strip()}" for i, p in enumerate(pages, 1)) + "\n"
    return _bounded(name, text)


def _is_docx(name: str, data: bytes) -> bool:
    return data.startswith(b"PK\x03\x04") and name.lower().endswith((".docx", ".docm"))


def _docx_text(name: str, data: bytes) -> str:
    """A Word document's paragraphs, and its tables as rows of cells between bars, in the
    order they come (python-docx)."""
    if len(data) > MAX_PDF_BYTES:
        raise AttachmentRefused(f"{name} is over {_size(MAX_PDF_BYTES)}; attach a shorter one")
    import docx  # imported here: only a Word document needs it

    lines: list[str] = []
    try:
        for block in docx.Document(io.BytesIO(data)).iter_inner_content():
            if hasattr(block, "rows"):  # a table
                lines.extend(
                    "| " + " | ".join(c.text for c in row.cells) + " |" for row in block.rows
                )
            else:
                lines.append(block.text)
    except Exception as e:  # noqa: BLE001 (a damaged file reaches the parser as any error)
        raise AttachmentRefused(
            f"{name} is not a readable Word document ({type(e).__name__}: {e})"
        ) from None
    text = "\n".join(lines).strip()
    if not text:
        raise AttachmentRefused(f"{name} holds no text (pictures only?): the model reads text only")
    return _bounded(name, text + "\n")


def _bounded(name: str, text: str) -> str:
    if len(text) > MAX_TEXT_CHARS:
        raise AttachmentRefused(
            f"{name} holds {len(text):,} characters of text; a message may take up to "
            f"{MAX_TEXT_CHARS:,} (about 250,000 tokens, more than the context holds). Attach "
            "the part you need"
        )
    return text


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"
