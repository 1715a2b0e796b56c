"""The fenced code blocks of a Markdown message, found as CommonMark finds them, so that each
can be copied alone: the message view puts a "Copy code" link above each one.

Written here rather than taken from a Markdown library: Qt renders the Markdown (its own
parser), and all that is needed is where each fence opens and what it holds, as the same
rules read it (a fence of three or more backticks or tildes, indented at most three
spaces; closed by a fence of the same character at least as long; a backtick fence whose
info string holds a backtick is not a fence). A block still open (a reply streaming in)
runs to the end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPEN = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")
CLOSE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*$")
SCHEME = "snug-copy"  # the links' scheme: `snug-copy:N` copies block N


@dataclass(frozen=True)
class CodeBlock:
    line: int  # the opening fence's line (0-based)
    code: str
    end: int  # the closing fence's line (the line count where the block is still open)


def code_blocks(markdown: str) -> list[CodeBlock]:
    lines = markdown.split("\n")
    out, i = [], 0
    while i < len(lines):
        opened = OPEN.match(lines[i])
        if opened is None or (opened.group(2)[0] == "`" and "`" in opened.group(3)):
            i += 1
            continue
        indent, fence = len(opened.group(1)), opened.group(2)
        body, j = [], i + 1
        while j < len(lines):
            closed = CLOSE.match(lines[j])
            if closed and closed.group(1)[0] == fence[0] and len(closed.group(1)) >= len(fence):
                break
            body.append(_dedent(lines[j], indent))
            j += 1
        out.append(CodeBlock(i, "\n".join(body), j))
        i = j + 1
    return out


def with_copy_links(markdown: str) -> tuple[str, list[str]]:
    """`markdown` with a "Copy code" link (`snug-copy:N`) on its own line above each code
    block, and the blocks' code, N for N."""
    blocks = code_blocks(markdown)
    if not blocks:
        return markdown, []
    lines = markdown.split("\n")
    for n, block in reversed(list(enumerate(blocks))):
        lines[block.line : block.line] = ["", f"[Copy code]({SCHEME}:{n})"]
    return "\n".join(lines), [b.code for b in blocks]


def _dedent(line: str, indent: int) -> str:
    """A code line less the opening fence's indent (as many leading spaces as it has)."""
    spaces = len(line) - len(line.lstrip(" "))
    return line[min(spaces, indent) :]
