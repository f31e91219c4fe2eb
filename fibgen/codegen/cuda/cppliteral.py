"""C++ spellings of text from a definition: string literals, comment text and identifiers.

Every string the CUDA target writes into C++ goes through `string` (inside quotes) or
`comment` (after `//`); every name used as C++ code goes through `identifier`. None of
them depends on the text being tame: any input gives a literal that means exactly that text,
and a comment that stays one comment.
"""

from __future__ import annotations

import re

from fibgen.codegen.errors import GenerateError

_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - {"\\", '"', "?"}
_NAMED = {"\\": "\\\\", '"': '\\"', "?": "\\?", "\n": "\\n", "\t": "\\t"}


def string(text: str) -> str:
    """A C++ narrow string literal whose bytes are the UTF-8 of ``text``.

    Printable ASCII is written as is, but for the three characters that mean something in a
    literal: the backslash, the quote and '?' (so that no trigraph such as ``??/`` forms).
    Everything else, newlines and bytes of non-ASCII characters included, is a three-digit
    octal escape, which ends after three digits, so a digit after it is read as a digit.
    """
    out = ['"']
    for ch in text:
        if ch in _PLAIN:
            out.append(ch)
        elif ch in _NAMED:
            out.append(_NAMED[ch])
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode("utf-8", "surrogatepass"))
    out.append('"')
    return "".join(out)


def comment(text: str) -> str:
    """Text for the rest of a ``//`` line: as is when that is safe, else as a literal.

    A newline would end the comment and start code; a backslash at the end of the line (or
    ``??/``) would splice the next line into the comment. Text that could do either is
    written as the string literal of it, which holds neither and ends with a quote.
    """
    if text.isprintable() and "\\" not in text and "??" not in text:
        return text
    return string(text)


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def identifier(name: str) -> str:
    """``name`` when it is a C++ identifier (ASCII letters, digits, '_'); else GenerateError."""
    if not _IDENTIFIER.fullmatch(name):
        raise GenerateError(f"{name!r} is not a C++ identifier")
    return name
