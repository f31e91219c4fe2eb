"""Parse `.fidef` text into a Lark tree; Lark's exceptions stop here as diagnostics."""

from __future__ import annotations

import json
import re
from functools import lru_cache

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from fibgen.compiler.diagnostics import Diagnostic, error
from fibgen.compiler.ir import Span
from fibgen.paths import grammars_dir

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
# this callback, and `parse_with_comments` takes the ones of its own run.
_comments: list[lark.Token] = []


def _collect_comment(token: lark.Token) -> lark.Token:
    _comments.append(token)
    return token


@lru_cache(maxsize=1)
def _mistakes() -> tuple[dict[str, list[str]], dict[str, tuple[str, str]]]:
    data = json.loads((grammars_dir() / "mistakes.json").read_text(encoding="utf-8"))
    examples = {m["id"]: m["examples"] for m in data}
    words = {m["id"]: (m["message"], m["help"]) for m in data}
    return examples, words


def _describe_expected(expected: set[str]) -> str:
    words = sorted({_TERMINAL_WORDS.get(t, _keyword(t)) for t in expected})
    if not words:
        return "nothing"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _keyword(terminal: str) -> str:
    # Lark names anonymous keyword terminals after their text, upper-cased.
    return f"'{terminal.lower()}'" if terminal.isupper() else terminal


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
    examples, words = _mistakes()
    label = None
    try:
        label = exc.match_examples(_parser().parse, examples, use_accepts=True)
    except Exception:  # a failing example never hides the real error
        label = None
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        if tok.type == "$END":
            line, column, width = _end_position(text)
        else:
            line, column = tok.line, tok.column
            width = max(1, len(str(tok).splitlines()[0]) if str(tok) else 1)
        message = f"expected {_describe_expected(exc.accepts or exc.expected)}, found {_found(tok)}"
    elif isinstance(exc, UnexpectedCharacters):
        line, column, width = exc.line, exc.column, 1
        char = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        message = f"unexpected character {char!r}"
    else:  # UnexpectedEOF
        line, column, width = _end_position(text)
        message = "unexpected end of file"
    span = _span(path, line, column, width)
    if label is not None:
        title, help_text = words[label]
        return error(title, span, help=f"{help_text} ({message})")
    return error(message, span)


def _end_position(text: str) -> tuple[int, int, int]:
    lines = text.splitlines() or [""]
    return len(lines), len(lines[-1]) + 1, 1


def parse_with_comments(
    text: str, path: str
) -> tuple[lark.Tree | None, list[Diagnostic], list[tuple[int, int, str]]]:
    """Like `parse`, also returning comments as (line, column, text)."""
    _comments.clear()
    tree, diags = parse(text, path)
    comments = [(t.line, t.column, str(t).rstrip()) for t in _comments]
    _comments.clear()
    return tree, diags, comments


_TOP_LEVEL = re.compile(r"^(family|dispatch)\b", re.M)


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
