"""Parse `.fidef` text into a Lark tree; Lark's exceptions stop here as diagnostics."""

from __future__ import annotations

import contextvars
import json
import re
from functools import lru_cache
from typing import TYPE_CHECKING, cast

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from fibgen.compiler.diagnostics import Diagnostic, error
from fibgen.compiler.ir import Span
from fibgen.paths import grammars_dir

if TYPE_CHECKING:
    from fibgen.compiler.lower.text import PosToken

# How terminals are called in messages.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "INT": "an integer",
    "SIGNED_INT": "an integer",
    "SIGNED_FLOAT": "a number",
    "TAG": "a tag",
    "STRING": "a string",
    "LONG_STRING": "a string",
    "LONG_STRING_SQ": "a string",
    "EXPR": "an expression",
    "PARAMS": "a parenthesized list",
    "_NL": "end of line",
    "$END": "end of file",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COLON": "':'",
    "SEMICOLON": "';'",
    "COMMA": "','",
    "EQUAL": "'='",
    "DOT": "'.'",
}


@lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    # Loaded once and lazily; Lark caches the LALR tables on disk keyed by the grammar's hash,
    # which keeps a cold `fibgen build` fast.
    grammar = (grammars_dir() / "fidef.lark").read_text(encoding="utf-8")
    return lark.Lark(
        grammar,
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
        cache=True,
        lexer_callbacks={"COMMENT": _collect_comment},
    )


# Comments are ignored by the grammar but kept for `fibgen fmt`: the lexer hands each one to
# this callback, which adds it to the list of the `parse_with_comments` call in progress in
# this thread or task (none for a plain `parse`), so that parses on several threads, or one
# inside another, each keep their own.
_comments: contextvars.ContextVar[list[PosToken] | None] = contextvars.ContextVar(
    "fibgen_parser_comments", default=None
)


def _collect_comment(token: lark.Token) -> lark.Token:
    collected = _comments.get()
    if collected is not None:
        collected.append(cast("PosToken", token))  # a lexed token: its position is set
    return token


def _signature(exc: UnexpectedInput) -> tuple | None:
    # What identifies a mistake: the parser state it stopped in and what it found there.
    # (Lark's own match_examples compares whole state stacks, so an example only matches
    # at the same nesting depth; the innermost state is what the mistake is about.)
    state = getattr(exc, "state", None)
    token = getattr(exc, "token", None)
    if state is None or token is None:
        return None
    position = getattr(state, "position", state)
    return (position, token.type)


@lru_cache(maxsize=1)
def _mistakes() -> tuple[dict[tuple, str], dict[str, tuple[str, str]]]:
    data = json.loads((grammars_dir() / "mistakes.json").read_text(encoding="utf-8"))
    signatures: dict[tuple, str] = {}
    for m in data:
        for example in m["examples"]:
            try:
                _parser().parse(example)
            except UnexpectedInput as exc:
                sig = _signature(exc)
                if sig is not None:
                    signatures.setdefault(sig, m["id"])
    words = {m["id"]: (m["message"], m["help"]) for m in data}
    return signatures, words


def _describe_expected(expected: set[str]) -> str:
    words = sorted({_TERMINAL_WORDS.get(t, _keyword(t)) for t in expected})
    if not words:
        return "nothing"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _keyword(terminal: str) -> str:
    # Keyword terminals are named _KW_<word> in the grammar (filtered from the tree).
    if terminal.startswith("_KW_"):
        return f"'{terminal[4:].lower()}'"
    return {"_LARROW": "'<-'", "_RARROW": "'->'"}.get(terminal, terminal.lower())


def _found(token: lark.Token) -> str:
    if token.type == "$END":
        return "end of file"
    if token.type == "_NL":
        return "end of line"
    text = str(token)
    if len(text) > 30:
        text = text[:27] + "..."
    return f"'{text}'"


def _span(path: str, line: int, column: int, width: int = 1) -> Span:
    return Span(file=path, line=line, column=column, end_line=line, end_column=column + width)


def _to_diagnostic(exc: UnexpectedInput, path: str, text: str) -> Diagnostic:
    at_end = isinstance(exc, UnexpectedEOF) or (
        isinstance(exc, UnexpectedToken) and exc.token.type == "$END"
    )
    if at_end:
        brace = _unclosed_brace(text)
        if brace is not None:
            line, column = brace
            return error(
                "unclosed '{'",
                _span(path, line, column),
                help="the file ends before this block's matching '}'",
            )
    # Where the lexer stopped: set on every UnexpectedCharacters.
    pos = exc.pos_in_stream or 0
    if isinstance(exc, UnexpectedCharacters) and text[pos : pos + 1] in "\"'":
        return error(
            "unterminated string",
            _span(path, exc.line, exc.column),
            help='close it with a matching quote on the same line, or use """...""" '
            "for text over several lines",
        )
    signatures, words = _mistakes()
    sig = _signature(exc)
    label = signatures.get(sig) if sig is not None else None
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        if tok.type == "$END":
            line, column, width = _end_position(text)
        else:
            line, column = tok.line, tok.column
            width = max(1, len(str(tok).split("\n")[0].rstrip("\r")) if str(tok) else 1)
        message = f"expected {_describe_expected(exc.accepts or exc.expected)}, found {_found(tok)}"
    elif isinstance(exc, UnexpectedCharacters):
        line, column, width = exc.line, exc.column, 1
        char = text[pos] if pos < len(text) else ""
        message = f"unexpected character {char!r}"
    else:  # UnexpectedEOF
        line, column, width = _end_position(text)
        message = "unexpected end of file"
    span = _span(path, line, column, width)
    if label is not None:
        title, help_text = words[label]
        return error(title, span, help=f"{help_text} ({message})")
    return error(message, span)


def _unclosed_brace(text: str) -> tuple[int, int] | None:
    """Line and column of the last '{' left open, skipping strings and comments."""
    stack: list[tuple[int, int]] = []
    line, col, i, n = 1, 1, 0, len(text)
    while i < n:
        ch = text[i]
        if text.startswith(('"""', "'''"), i):
            end = text.find(text[i : i + 3], i + 3)
            end = n if end < 0 else end + 3
        elif ch in "\"'":
            end = text.find(ch, i + 1)
            newline = text.find("\n", i + 1)
            end = (newline if newline >= 0 else n) if end < 0 or (0 <= newline < end) else end + 1
        elif ch == "#":
            end = text.find("\n", i)
            end = n if end < 0 else end
        else:
            if ch == "{":
                stack.append((line, col))
            elif ch == "}" and stack:
                stack.pop()
            end = i + 1
        chunk = text[i:end]
        newlines = chunk.count("\n")
        if newlines:
            line += newlines
            col = len(chunk) - chunk.rfind("\n")
        else:
            col += len(chunk)
        i = end
    return stack[-1] if stack else None


def _end_position(text: str) -> tuple[int, int, int]:
    # Lines as the lexer counts them (at '\n' only); a final newline starts no line.
    lines = [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")]
    return len(lines), len(lines[-1]) + 1, 1


def parse_with_comments(
    text: str, path: str
) -> tuple[lark.Tree | None, list[Diagnostic], list[tuple[int, int, str]]]:
    """Like `parse`, also returning comments as (line, column, text)."""
    collected: list[PosToken] = []
    reset = _comments.set(collected)
    try:
        tree, diags = parse(text, path)
    finally:
        _comments.reset(reset)
    comments = [(t.line, t.column, str(t).rstrip()) for t in collected]
    return tree, diags, comments


_TOP_LEVEL = re.compile(r"^(family|dispatch|unroutable)\b", re.M)


def parse(text: str, path: str) -> tuple[lark.Tree | None, list[Diagnostic]]:
    """Parse one file; on a syntax error, resume at each top-level item to report them all."""
    try:
        return _parser().parse(text), []
    except UnexpectedInput as exc:
        first = _to_diagnostic(exc, path, text)
    # Recovery: parse each top-level item on its own (padded with newlines so positions stay
    # right) and report every item that fails, not only the first.
    diags: list[Diagnostic] = []
    starts = [m.start() for m in _TOP_LEVEL.finditer(text)]
    if len(starts) <= 1:
        return None, [first]
    bounds = list(zip(starts, starts[1:] + [len(text)]))
    if starts[0] > 0 and text[: starts[0]].strip():
        bounds.insert(0, (0, starts[0]))
    for begin, end in bounds:
        chunk = "\n" * text.count("\n", 0, begin) + text[begin:end]
        try:
            _parser().parse(chunk)
        except UnexpectedInput as exc:
            diags.append(_to_diagnostic(exc, path, chunk))
    return None, diags or [first]
