"""The docs name files and modules that exist.

Every repository path and every dotted name under ``fibgen`` that the pages of ``PAGES``
mention must resolve, so that a move or a rename that leaves a page behind fails here, with
each stale mention as ``page:line``. What counts as a mention:

- a *path*: a word of an inline code span, or a link target, that holds a ``/`` and whose
  first part is an entry of the repository's root (``fibgen/...``, ``tests/...``,
  ``generated/...``, ``templates/...``, ``definitions/``); in prose, such a word that also
  ends in ``/`` or in a file name with a suffix. It must exist, and be a folder where it ends
  in ``/``. Link targets are read relative to their page. Paths that
  start elsewhere are a dataset's or a user's (``workloads/``, ``traces/<op_type>/...``) and
  are not checked;
- a *file name*: a word of an inline code span without ``/`` that ends in a source suffix
  (``console.py``, ``cuda_kernel.cuh.j2``); a file of that name must exist in the repository;
- a *dotted name*: ``fibgen.`` followed by identifiers (``fibgen.runtime.for_generated``,
  ``fibgen.runtime.routing.api.Api``): the longest prefix that is a module is imported and
  the rest looked up as attributes.

Placeholders and what is not a repository path are skipped by one rule: a word that holds
``<``, ``>``, ``*``, ``{``, ``}``, ``$``, ``~``, ``|``, ``...`` or ``://``, or starts with
``/`` (``tests/test_<family>.py``, ``solutions/**/*.json``, ``$FIBGEN_CACHE_DIR/locks/``,
``/tmp/...``). Fenced code blocks are left out: they are examples, which ``tests/test_docs.py``
runs or compiles. The few mentions of a user's own files that look like the repository's are
listed in ``NOT_REPOSITORY``, each with why.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The pages whose mentions are checked.
PAGES = ("README.md", "docs/architecture.md", "docs/language.md", "RELIABILITY.md")

# Mentions that look like the repository's files but name a user's, and why.
NOT_REPOSITORY = {
    "solutions/me/rmsnorm/rmsnorm_h4096/python_rmsnorm_h4096/": (
        "the folder `fibgen scaffold-solution --author me` writes in a folder of one's own"
    ),
    "main.py": "the entry file of a scaffolded Python solution, in a folder of one's own",
}

PLACEHOLDER = re.compile(r"[<>*{}$~|]|\.\.\.|://")
SOURCE_SUFFIX = re.compile(r"^[\w.-]+\.(py|md|j2|lark|toml|cu|cuh|cpp|h|txt)$")
DOTTED = re.compile(r"(?<![\w.])fibgen(?:\.[A-Za-z_]\w*)+")
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# Around a word: markup and punctuation that are not part of the path.
LEADING = "([*\"'"
TRAILING = ")]*,.;:\"'!?"


def _blank(match: re.Match[str]) -> str:
    """The match's text turned into spaces, its newlines kept (lines keep their numbers)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _clean(word: str) -> str:
    return word.lstrip(LEADING).rstrip(TRAILING)


def _is_placeholder(word: str) -> bool:
    return bool(PLACEHOLDER.search(word)) or word.startswith("/")


def mentions(text: str) -> Iterator[tuple[str, str, int]]:
    """(kind, mention, line) of every path, file name, link and dotted name of a page."""
    text = FENCE.sub(_blank, text)
    for match in DOTTED.finditer(text):
        yield "name", match.group(0), _line(text, match.start())
    for match in LINK.finditer(text):
        target = match.group(1).split("#")[0]
        if target and not _is_placeholder(target) and ":" not in target:
            yield "link", target, _line(text, match.start(1))
    text = LINK.sub(lambda m: "]" + _blank(m)[1:], text)
    for match in CODE_SPAN.finditer(text):
        for word in re.finditer(r"\S+", match.group(2)):
            offset = match.start(2) + word.start()
            yield from _word(_clean(word.group(0)), _line(text, offset), code=True)
    prose = CODE_SPAN.sub(_blank, text)
    for word in re.finditer(r"\S+", prose):
        yield from _word(_clean(word.group(0)), _line(prose, word.start()), code=False)


def _word(word: str, line: int, *, code: bool) -> Iterator[tuple[str, str, int]]:
    if not word or _is_placeholder(word):
        return
    if "/" in word:
        # In prose, `a/b` is as often a pair of words ("solutions/workloads/traces of ..."):
        # there a path is one that names a folder (a trailing `/`) or a file (a suffix).
        looks_like_path = code or word.endswith("/") or "." in word.rsplit("/", 1)[1]
        if looks_like_path and word.split("/")[0] in _root_entries():
            yield "path", word, line
    elif code and SOURCE_SUFFIX.match(word):
        yield "file", word, line


def _root_entries() -> set[str]:
    return {p.name for p in REPO.iterdir()} - {".git"}


def _file_names() -> set[str]:
    names: set[str] = set()
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        names.update(files)
    return names


def _module_prefix(parts: list[str]) -> tuple[object | None, int, str | None]:
    """The longest importable module of ``parts``: (module, its length, an import error that
    is not a missing module of that prefix)."""
    for size in range(len(parts), 0, -1):
        name = ".".join(parts[:size])
        try:
            return importlib.import_module(name), size, None
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
                continue  # no such module: try a shorter prefix
            return None, size, f"importing {name} fails: {exc}"
    return None, 0, None


def resolves(dotted: str) -> str | None:
    """Why ``dotted`` does not name a module of fibgen or an attribute of one, or None."""
    parts = dotted.split(".")
    module, size, problem = _module_prefix(parts)
    if problem is not None:
        return problem
    if module is None:
        return "no such module"
    obj = module
    for i, attr in enumerate(parts[size:], size):
        if not hasattr(obj, attr):
            return f"{'.'.join(parts[:i])} has no attribute {attr}"
        obj = getattr(obj, attr)
    return None


def stale(page: str) -> list[str]:
    """``page:line: mention (why)`` for every mention of the page that does not resolve."""
    path = REPO / page
    names = _file_names()
    found: list[tuple[int, str]] = []
    for kind, mention, line in mentions(path.read_text(encoding="utf-8")):
        if mention in NOT_REPOSITORY:
            continue
        why = None
        if kind == "name":
            why = resolves(mention)
        elif kind == "file":
            if mention not in names:
                why = "no file of that name in the repository"
        else:
            target = (path.parent if kind == "link" else REPO) / mention
            if not target.exists():
                why = "does not exist"
            elif mention.endswith("/") and not target.is_dir():
                why = "is not a folder"
        if why is not None:
            found.append((line, f"{page}:{line}: {mention} ({why})"))
    return [text for _, text in sorted(found, key=lambda item: item[0])]


@pytest.mark.parametrize("page", PAGES)
def test_every_path_and_name_a_page_mentions_exists(page):
    problems = stale(page)
    assert not problems, f"stale mentions in {page}:\n" + "\n".join(problems)


def test_the_pages_mention_enough_to_check():
    # A rule that stopped finding mentions would pass every page.
    text = (REPO / "docs/architecture.md").read_text(encoding="utf-8")
    kinds = {kind for kind, _, _ in mentions(text)}
    assert {"path", "file", "name"} <= kinds
    assert sum(1 for _ in mentions(text)) >= 100


def test_every_exception_is_still_mentioned():
    # NOT_REPOSITORY names only mentions that are there.
    found = {m for page in PAGES for _, m, _ in mentions((REPO / page).read_text("utf-8"))}
    assert not set(NOT_REPOSITORY) - found, set(NOT_REPOSITORY) - found


def test_the_rules_catch_stale_mentions_and_skip_placeholders(tmp_path, monkeypatch):
    text = "\n".join(
        [
            "Moved: `fibgen/compiler/check_rules.py`, `select_table.py` and",
            "fibgen/runtime/apply_state.py in prose; `fibgen.bench.no_such_module`,",
            "`fibgen.runtime.routing.api.NoSuchName`, [a link](no_such_page.md).",
            "Fine: `fibgen/runtime/routing/api.py`, `tests/test_layering.py`, `templates/`,",
            "`console.py`, `fibgen.runtime.for_generated`, `fibgen.runtime.routing.api.Api`,",
            "`fibgen.bench.ray_runner`, [the language](docs/language.md#rules).",
            "Placeholders: `tests/test_<family>.py`, `<name>.fibgen`, `solutions/**/*.json`,",
            "`$FIBGEN_CACHE_DIR/locks/`, `/tmp/fibgen-ray-UID/`, `workloads/`, `1/sqrt(d)`.",
            "```sh",
            "fibgen pack solutions/nobody/here/",
            "```",
        ]
    )
    (tmp_path / "page.md").write_text(text, encoding="utf-8")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "templates").mkdir()
    for file in (
        "fibgen/runtime/routing/api.py",
        "fibgen/cli/console.py",
        "tests/test_layering.py",
        "docs/language.md",
    ):
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).touch()
    reported = [line.split(": ", 1)[1].split(" (")[0] for line in stale("page.md")]
    assert sorted(reported) == sorted(
        [
            "fibgen/compiler/check_rules.py",
            "select_table.py",
            "fibgen/runtime/apply_state.py",
            "fibgen.bench.no_such_module",
            "fibgen.runtime.routing.api.NoSuchName",
            "no_such_page.md",
        ]
    )
    assert stale("page.md")[0].startswith("page.md:1: ")
