"""black over generated Python: cached by content, and spread over processes when cold.

black is the slowest stage of a build (about 9,000 lines/s here), so every emitter hands its
Python text to `format_python` at once: results already seen are read from a cache keyed by
the unformatted text, black's version and the mode; the rest are formatted in a process pool
when there are enough of them to pay for it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

LINE_LENGTH = 100
_PARALLEL_FROM = 16  # below this many files a pool costs more than it saves


def _mode():
    import black

    return black.Mode(line_length=LINE_LENGTH)


def _format_one(text: str) -> str:
    import black

    return black.format_str(text, mode=_mode())


@functools.lru_cache(maxsize=None)
def format_one_line(expr: str) -> str:
    """One Python expression as black writes it, on one line whatever its length."""
    import black

    prefix = "_ = "
    text = black.format_str(prefix + expr + "\n", mode=black.Mode(line_length=1 << 20))
    return text.strip()[len(prefix) :]


# Lines black leaves long: a one-line docstring, and a name bound to one string literal.
_UNSPLITTABLE = re.compile(
    r'^\s*("""[^\n]*"""|[A-Za-z_][A-Za-z0-9_]* = ("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'))$'
)


def _fits(text: str) -> bool:
    return all(len(line) <= LINE_LENGTH or _UNSPLITTABLE.match(line) for line in text.splitlines())


def cache_dir() -> Path | None:
    """Where formatted results are kept ($FIBGEN_CACHE_DIR, else the user cache); None to skip."""
    root = os.environ.get("FIBGEN_CACHE_DIR")
    if root == "":
        return None
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return (base if root else base / "fibgen") / "black"


# Bumped when this module formats differently, so that cached results are not reused.
_FORMAT_VERSION = 5


def _key(text: str) -> str:
    import black

    salt = f"{black.__version__}|{LINE_LENGTH}|{_FORMAT_VERSION}|"
    return hashlib.sha256((salt + text).encode("utf-8")).hexdigest()


def _read(folder: Path | None, key: str) -> str | None:
    if folder is None:
        return None
    try:
        return (folder / key[:2] / f"{key}.py").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _write(folder: Path | None, key: str, text: str) -> None:
    if folder is None:
        return
    from fibgen.codegen.writer import atomic_write

    try:
        atomic_write(folder / key[:2] / f"{key}.py", text)
    except OSError:  # a cache that cannot be written is only slower, never wrong
        pass


def _format_statement(line: str) -> str:
    """black one long statement on its own, at its indentation."""
    import black

    body = line.lstrip(" ")
    indent = line[: len(line) - len(body)]
    header = body.endswith(":")  # a `def ...:` or `if ...:` line: give it a body to parse
    # An `elif` cannot stand alone: black formats it after an `if` it continues.
    elif_ = body.startswith("elif ")
    lead = "if _:\n    pass\n" if elif_ else ""
    snippet = lead + body + ("\n    pass\n" if header else "\n")
    mode = black.Mode(line_length=LINE_LENGTH - len(indent))
    try:
        out = black.format_str(snippet, mode=mode)
    except black.InvalidInput:
        # A line inside a bracketed construct (a table entry): black leaves such atoms be.
        return line + "\n"
    if elif_:
        out = out[out.index("elif ") :]
    if header:
        out = out[: out.rindex("    pass\n")]
    return "".join(indent + row if row.strip() else row for row in out.splitlines(True))


# `[targets = ][return ]name.attr(`, `def name(`, `return "...".format(` or `[...] = {`: the
# head of a statement that black splits at its one trailing bracket pair (its right-hand
# split), with nothing else to consider.
_CALL_HEAD = re.compile(
    r"^(?:def |return |(?:[A-Za-z_][\w.]*, )*[A-Za-z_][\w.]* = )?"
    r'(?:[A-Za-z_][\w.]*\(|"[^"\\]*"\.format\(|\{)$'
)


def _top_level_args(text: str) -> list[str] | None:
    """Split at top-level commas; None when brackets or quotes do not balance simply."""
    args, depth, start, quote = [], 0, 0, None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    if depth or quote:
        return None
    args.append(text[start:].strip())
    return args


def _split_call(line: str) -> str | None:
    """black's split of a too-long simple call or def, or None when black must decide."""
    body = line.lstrip(" ")
    indent = line[: len(line) - len(body)]
    tail = ":" if body.endswith("):") else ""
    closer = "}" if body.endswith("}") else ")"
    if not body.endswith(closer + tail):
        return None
    open_at = body.find("{" if closer == "}" else "(")
    head = body[: open_at + 1]
    if not _CALL_HEAD.match(head):
        return None
    args = _top_level_args(body[open_at + 1 : len(body) - len(tail) - 1])
    if not args or any(not a for a in args) or any(a.startswith("*") and a != "*" for a in args):
        return None  # *args, **kwargs: black's trailing comma after them depends on versions
    inner = indent + "    "
    one_line = inner + ", ".join(args)
    if len(indent + head) > LINE_LENGTH:
        return None
    if len(one_line) <= LINE_LENGTH and closer == ")":
        # A call's arguments stay on one line when they fit; a collection literal is split
        # one element per line (black's rule for literals).
        return f"{indent}{head}\n{one_line}\n{indent}{closer}{tail}\n"
    rows = [inner + a + "," for a in args]
    if "*" in args:
        # After a bare `*`, black adds no magic trailing comma (the versions it infers).
        rows[-1] = rows[-1][:-1]
    if any(len(r) > LINE_LENGTH for r in rows):
        return None
    return f"{indent}{head}\n" + "\n".join(rows) + f"\n{indent}{closer}{tail}\n"


def format_long_lines(text: str) -> str:
    """black only the statements longer than black's limit; the rest is taken as written.

    For text that is otherwise written the way black writes it (double-quoted literals, one
    statement per line, black's blank lines): black formats a simple statement the same on its
    own as in its module, so this gives black's output at a fraction of its cost. A test holds
    every generated module to black.
    """
    long_lines = [
        n
        for n, line in enumerate(text.split("\n"), 1)
        if len(line) > LINE_LENGTH and not _UNSPLITTABLE.match(line)
    ]
    if long_lines and not _lines_inside_brackets(text).isdisjoint(long_lines):
        # A line inside brackets is no statement: on its own, `key={...},` would read as a
        # tuple assignment. Such a module goes through black whole.
        return _format_one(text)
    out = []
    for line in text.splitlines(True):
        stripped = line.rstrip("\n")
        if len(stripped) > LINE_LENGTH and not _UNSPLITTABLE.match(stripped):
            out.append(_split_call(stripped) or _format_statement(stripped))
        else:
            out.append(line)
    return "".join(out).rstrip("\n") + "\n"  # black ends a module with one newline


def _lines_inside_brackets(text: str) -> set[int]:
    """Numbers of the lines that start inside an open bracket (a call's arguments, say)."""
    import io
    import tokenize

    inside: set[int] = set()
    depth, line = 0, 1
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if depth > 0:
            inside.update(range(line + 1, tok.start[0] + 1))
        line = tok.end[0]
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
    return inside


def format_python(texts: list[str], *, written_in_black_style: bool = False) -> list[str]:
    """black-format every text, in order.

    With ``written_in_black_style`` the texts come from emitters that write the way black
    writes but for statements too long for its limit: only those statements go through black
    (`format_long_lines`), and a text without any is taken as it is. A test holds every
    generated module to black. Results are cached by content; a pool spreads the rest.
    """
    folder = cache_dir()
    fn = format_long_lines if written_in_black_style else _format_one
    keys = [_key(("long-lines|" if written_in_black_style else "") + t) for t in texts]
    out: list[str | None] = [
        t if written_in_black_style and _fits(t) else _read(folder, k) for t, k in zip(texts, keys)
    ]
    todo = [i for i, r in enumerate(out) if r is None]
    workers = min(len(todo) // _PARALLEL_FROM + 1, os.cpu_count() or 1, 8)
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            done = list(pool.map(fn, [texts[i] for i in todo], chunksize=4))
    else:
        done = [fn(texts[i]) for i in todo]
    for i, text in zip(todo, done):
        out[i] = text
        _write(folder, keys[i], text)
    return [t for t in out if t is not None]
