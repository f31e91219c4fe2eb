"""Text inside tokens: triple-quoted blocks dedented, block statements split, comments cut."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, cast

from lark import Token

if TYPE_CHECKING:

    class PosToken(Token):
        """A token of the parsed text, or one made by ``make_token``: its position is known
        (lark types it as optional, for tokens made without one)."""

        line: int
        column: int
        end_line: int
        end_column: int

else:
    PosToken = Token


def dedent_block(body: str) -> str:
    """The text of a triple-quoted block, exactly as `printer.long_string` wrote it.

    In the block form (opening quotes end their line, closing quotes start theirs) the framing
    newline and the closing line's indentation are dropped and the common indentation of the
    non-blank lines is removed; everything else is kept byte for byte, so references survive
    a round trip with their blank lines, trailing whitespace and final newline.
    """
    lines = body.split("\n")
    if len(lines) == 1:
        return body.strip()
    if lines[0].strip():
        # Text starts on the opening line: keep that line, dedent the rest on its own.
        return (lines[0].strip() + "\n" + textwrap.dedent("\n".join(lines[1:]))).rstrip()
    lines = lines[1:]
    if lines and not lines[-1].strip():
        lines = lines[:-1]
    margin = None
    for line in lines:
        if line.strip():
            indent = line[: len(line) - len(line.lstrip(" \t"))]
            margin = indent if margin is None else _common_prefix(margin, indent)
    margin = margin or ""
    return "\n".join(
        line[len(margin) :] if line.startswith(margin) else line.lstrip(" \t") for line in lines
    )


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def make_token(text: str, line: int, column: int) -> PosToken:
    first = text.split("\n")[0]
    token = Token(
        "EXPR", text, line=line, column=column, end_line=line, end_column=column + len(first)
    )
    return cast(PosToken, token)


def _code_positions(line: str):
    """(index, character) of each character of a line that is outside string literals."""
    quote = None
    escaped = False
    for i, ch in enumerate(line):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        else:
            yield i, ch


def split_comment(line: str) -> tuple[str, int | None]:
    """Split a line at a '#' that is not inside a string literal."""
    for i, ch in _code_positions(line):
        if ch == "#":
            return line[:i], i
    return line, None


class Brackets:
    """The brackets open after the text fed so far, outside string literals.

    A statement continued over many lines is fed one line at a time, so that each line is
    scanned once: counting over the whole statement at every line made a constraint of
    10,000 lines take 83 s.
    """

    __slots__ = ("depth", "quote", "escaped")

    def __init__(self) -> None:
        self.depth = 0
        self.quote: str | None = None
        self.escaped = False

    def feed(self, text: str) -> int:
        """Scan more text (what follows the text fed before); the brackets open after it."""
        quote, escaped, depth = self.quote, self.escaped, self.depth
        for ch in text:
            if quote:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == quote:
                    quote = None
            elif ch in "\"'":
                quote = ch
            elif ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
        self.quote, self.escaped, self.depth = quote, escaped, depth
        return depth


def split_statements(code: str) -> list[str]:
    """Split a line at the ';' that are outside string literals and brackets."""
    cuts, depth = [], 0
    for i, ch in _code_positions(code):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == ";" and depth <= 0:
            cuts.append(i)
    bounds = zip([-1] + cuts, cuts + [len(code)])
    return [code[start + 1 : end] for start, end in bounds]
