"""Python literals spelled as black spells them, so templates can be black-clean as written.

Strings take double quotes unless that needs more escapes (black's rule); a non-empty dict
is exploded one entry per line with a trailing comma, which black keeps as it is.

Every string a generator writes into Python goes through one function here: `string` for a
literal, `docstring_text` for text inside a docstring, `comment` for text after '#'; every
name used as Python code through `identifier`. None depends on the text being tame.
"""

from __future__ import annotations

import keyword

from fibgen.codegen.errors import GenerateError


def string(text: str) -> str:
    """A string literal in black's quotes."""
    single = repr(text)
    if single.startswith('"'):
        return single  # repr chose double quotes: the text holds a single quote
    body = single[1:-1].replace("\\'", "'")
    if body.count('"') > single.count("\\'"):
        return single  # double quotes would need more escapes than the single ones
    return '"' + body.replace('"', '\\"') + '"'


def literal(value: object, indent: str = "") -> str:
    """A literal of str, number, bool, None, tuple, list or dict (dicts exploded)."""
    if isinstance(value, str):
        return string(value)
    if isinstance(value, tuple):
        items = [literal(v, indent) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v, indent) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        inner = indent + "    "
        rows = "".join(f"{inner}{literal(k)}: {literal(v, inner)},\n" for k, v in value.items())
        return "{\n" + rows + indent + "}"
    return repr(value)


def inline_dict(value: dict) -> str:
    """A short dict on one line, as black leaves one without a trailing comma."""
    return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"


def docstring_text(text: str) -> str:
    """``text`` for the inside of a triple-double-quoted docstring, on one line.

    Backslashes and quotes are escaped (no escape sequence and no closing quotes can form),
    and so is every character that is not printable, newlines included, so the docstring
    reads back as exactly ``text``. Ordinary prose comes out unchanged.
    """
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1])
    return "".join(out)


def comment(text: str) -> str:
    """Text for the rest of a '#' line: as is when printable, else its repr (one line)."""
    return text if text.isprintable() else repr(text)


def identifier(name: str) -> str:
    """``name`` when it can name a Python variable; else GenerateError."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise GenerateError(f"{name!r} cannot name a Python variable")
    return name
