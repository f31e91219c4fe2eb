"""Mutations of `.fidef` text for fuzzing the compiler, shared by tests/test_fuzz.py
(hypothesis draws the choices) and benchmarks/fuzz_compiler.py (a seeded random.Random).

A mutation is a function of the text and `choose(n)`, which returns an integer in [0, n):
the two drivers differ only in where the choices come from, so a crash found by one can be
replayed by the other's vocabulary. The seeds are the families of the catalogue, one at a
time (a whole file compiles ten times slower, and mutations rarely need more than one
family), plus the catalogue's smaller files whole, for what spans families.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
Choose = Callable[[int], int]

_TOP_LEVEL = re.compile(r"^(?:family|dispatch)\b", re.M)


def _chunks(text: str) -> list[str]:
    """The top-level items of a file, each with the comment lines just above it."""
    starts = [m.start() for m in _TOP_LEVEL.finditer(text)]
    out = []
    for begin, end in zip(starts, starts[1:] + [len(text)]):
        # Take the comment block that precedes the item along with it.
        head = text.rfind("\n\n", 0, begin)
        head = 0 if head < 0 else head + 2
        lead = text[head:begin]
        if not all(line.startswith("#") for line in lead.splitlines()):
            lead = ""
        out.append(lead + text[begin:end].rstrip("\n") + "\n")
    return out


def seeds() -> list[str]:
    """The catalogue's families one by one, then its files of under 100 lines whole."""
    files = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "definitions").glob("*.fidef"))]
    out = [chunk for text in files for chunk in _chunks(text)]
    out += [text for text in files if text.count("\n") < 100]
    return out


# Pieces of the language, and pieces that broke it once (see issue 14, items 5 to 8).
FRAGMENTS: tuple[str, ...] = (
    "{",
    "}",
    "[",
    "]",
    ":",
    "=",
    "<-",
    "->",
    '"',
    '"""',
    "'''",
    "#",
    ";",
    "\n",
    "\r",
    "\r\n",
    "\0",
    "\\",
    "\t",
    "\f",
    "\ufeff",
    "\u2028",
    "é",
    "var",
    "const",
    "family",
    "dispatch",
    "gen",
    "plan.",
    "(",
    ")",
    "dtype(",
    "optional",
    "scalar",
    "0",
    "-1",
    "1e999",
    "9" * 40,
    "9" * 5000,
    "(" * 200,
    "[" * 120,
    "-" * 3000 + "1",
    "+1" * 3000,
    '"\\ud800"',
    '"\\N{no such name}"',
    '"\\x"',
    '"a\\"b\\\\"',
    "import",
    "4n",
    "class",
    "None",
    "lambda",
    "9**9**9",
    "factorial(10**9)",
    "round(5, -10**18)",
    "1/0",
    "*/",
    "??=",
    "${x}",
    "{{",
    "}}",
    'name "../x{h}"',
    'name "a\\nb"',
    "requires sm90",
    "tolerance(atol=1e999)",
    "tolerance(atol=" + "9" * 400 + ")",
    "effect out = x",
    "instances { h=1 }",
    "params { p }",
    'reference """\ndef run(x):\n    return x\n"""',
    # 200 open parentheses and more code after them: Python's parser runs out of stack.
    'reference """\n' + "x = " + "(" * 200 + '\ndef run(x):\n    return x\n"""',
    'tags [a, "b\\"c"]',
    "<- x[" + "9" * 30 + "]",
    "<- x[1000000000000]",
    # The rules block and its statements.
    "rules {\n  ignore x\n}",
    "rules {\n  x == 1\n}",
    "ignore ",
    "default plan.x = ",
    "let y = (",
    "result out = ",
    "keywords kw = f(",
    'api none "no API"',
    "api none",
    "returns output, new_state",
    "returns none",
    "returns ",
    "params { EPS = 1e-06 }",
    "EPS = " + "9" * 1200,
    "x = ",
)

# What a derived const or an instance value can be replaced by.
VALUES: tuple[str, ...] = (
    "import",
    "4n",
    "4 * hidden_size +",
    "9**9**9",
    "2**64",
    "2**63",
    "-1",
    "0.5",
    "1/0",
    "math.inf",
    "factorial(10**9)",
    "round(5, -10**18)",
    "min()",
    "x.y.z",
    "[1]",
    "'a'",
    "True",
    "9" * 4400,
    "1" + "+1" * 2000,
    "(" * 150 + "1" + ")" * 150,
    "lambda: 1",
    "__import__('os')",
    "1e999",
    '"../../x"',
    '"a b"',
)

_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*|[0-9]+(?:\.[0-9]*)?')
_ASSIGNED = re.compile(r"(=\s*)([^\n;#{}]+)")
_ODD_CHARS = "\0\r\t\\\"'{}[]()<>-=#;:.,é\u2028\ufeff"


def _pick(seq, choose: Choose):
    return seq[choose(len(seq))]


def _delete(text: str, choose: Choose, pool: list[str]) -> str:
    pos = choose(len(text) + 1)
    return text[:pos] + text[pos + 1 + choose(40) :]


def _insert(text: str, choose: Choose, pool: list[str]) -> str:
    pos = choose(len(text) + 1)
    if choose(4) == 0:
        piece = "".join(_pick(_ODD_CHARS, choose) for _ in range(1 + choose(4)))
    else:
        piece = _pick(FRAGMENTS, choose)
    return text[:pos] + piece + text[pos:]


def _lines(text: str, choose: Choose, pool: list[str]) -> str:
    lines = text.split("\n")
    i, j = choose(len(lines)), choose(len(lines))
    kind = choose(3)
    if kind == 0:
        lines.insert(j, lines[i])
    elif kind == 1:
        lines[i], lines[j] = lines[j], lines[i]
    else:
        # A line of another seed: statements meet families they were not written for.
        other = _pick(pool, choose).split("\n")
        lines.insert(j, _pick(other, choose))
    return "\n".join(lines)


def _replace_token(text: str, choose: Choose, pool: list[str]) -> str:
    tokens = list(_TOKEN.finditer(text))
    if not tokens:
        return text
    m = _pick(tokens, choose)
    token = m.group(0)
    if token[0] == '"':
        replacement = '"' + _pick(("\\0", "\\r\\n", '\\"', "\\\\", "*/", "??/", "\\u2028"), choose)
        replacement += token[1:]
    elif token[0].isdigit():
        replacement = _pick(("0", "-1", "9" * 25, "9" * 1200, "1e999", "1.5", "007"), choose)
    else:
        replacement = _pick(
            ("class", "None", "run", "torch", "_", "x" * 200, token + token), choose
        )
    return text[: m.start()] + replacement + text[m.end() :]


def _replace_value(text: str, choose: Choose, pool: list[str]) -> str:
    spots = list(_ASSIGNED.finditer(text))
    if not spots:
        return text
    m = _pick(spots, choose)
    return text[: m.start(2)] + _pick(VALUES, choose) + text[m.end(2) :]


_BLOCK = re.compile(r"\{[^{}]*\}")


def _empty_block(text: str, choose: Choose, pool: list[str]) -> str:
    # Keep a block's comments, drop its statements: what `fmt` then does with the comments.
    blocks = list(_BLOCK.finditer(text))
    if not blocks:
        return text
    m = _pick(blocks, choose)
    kept = [line for line in m.group(0)[1:-1].split("\n") if line.strip().startswith("#")]
    if not kept:
        kept = ["    # " + _pick(("note", "a } brace", 'a " quote', "é"), choose)]
    return text[: m.start()] + "{\n" + "\n".join(kept) + "\n}" + text[m.end() :]


def _comment(text: str, choose: Choose, pool: list[str]) -> str:
    # A comment on a line of its own, or at the end of a line.
    lines = text.split("\n")
    i = choose(len(lines))
    body = "# " + _pick(("c", "x = 1 }", '"""', "{", "é\u2028"), choose)
    if choose(2):
        lines.insert(i, body)
    else:
        lines[i] += "  " + body
    return "\n".join(lines)


MUTATIONS = (
    _delete,
    _insert,
    _insert,
    _lines,
    _replace_token,
    _replace_value,
    _empty_block,
    _comment,
)


def mutate(text: str, choose: Choose, pool: list[str], count: int) -> str:
    """Apply `count` mutations chosen by `choose` to `text`; `pool` holds the other seeds."""
    for _ in range(count):
        text = _pick(MUTATIONS, choose)(text, choose, pool)
    return text
