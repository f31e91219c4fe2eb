"""How a module's families and `unroutable` declarations cover FlashInfer's traced entry points.

Every entry point FlashInfer traces (``fibgen.format.fi_apis``) is routed (a family's `api` or
`plan` line names it, by any path that reaches it), declared unroutable with its reason, or
neither: not yet covered (status "missing"), which `fibgen list --apis` flags and the
catalogue's coverage test refuses unless the entry point is on its list of those still to
cover (Note [declared entry points] in ``ir.py``). Routed and declared at once is a contradiction,
which the checker reports; it is kept apart here too, for a module compiled without
FlashInfer's source at hand (where two spellings of one entry point were not matched).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fibgen.compiler import ir

if TYPE_CHECKING:
    from fibgen.format.fi_apis import TracedApi, TracedApis

Status = Literal["routed", "unroutable", "both", "missing"]
STATUSES: tuple[Status, ...] = ("routed", "unroutable", "both", "missing")


@dataclass(frozen=True)
class Route:
    """A family whose `api` (or `plan`) line names an entry point."""

    family: str
    keyword: str  # "api" or "plan"
    path: str  # as the family's line spells it
    definitions: tuple[str, ...]


@dataclass(frozen=True)
class EntryCoverage:
    """One traced entry point and what the module says of it."""

    api: TracedApi
    routes: tuple[Route, ...] = ()
    unroutable: ir.Unroutable | None = None

    @property
    def status(self) -> Status:
        """routed, unroutable, both (a contradiction) or missing (neither)."""
        if self.routes:
            return "both" if self.unroutable is not None else "routed"
        return "unroutable" if self.unroutable is not None else "missing"

    @property
    def definitions(self) -> tuple[str, ...]:
        """The definitions its routes hold, sorted."""
        return tuple(sorted({d for r in self.routes for d in r.definitions}))


@dataclass(frozen=True)
class Coverage:
    """Every traced entry point of one FlashInfer, and what else the module names."""

    version: str
    entries: tuple[EntryCoverage, ...]
    # Families whose `api` names an API FlashInfer traces nothing for: routed, but not one of
    # its traced entry points. (A `plan` that is not traced is the rule, not said.)
    untraced: tuple[Route, ...]
    # Declarations whose path names no traced entry point (the checker refuses them where
    # it was given FlashInfer's source).
    unknown: tuple[ir.Unroutable, ...]

    def with_status(self, *statuses: Status) -> tuple[EntryCoverage, ...]:
        """The entries of any of these statuses, in entry-point order."""
        return tuple(e for e in self.entries if e.status in statuses)

    def counts(self) -> dict[Status, int]:
        """How many entries have each status."""
        return {s: len(self.with_status(s)) for s in STATUSES}

    def summary(self) -> str:
        """One line: routed N of TOTAL, declared M, not yet covered K (and both, when any)."""
        c = self.counts()
        routed = c["routed"] + c["both"]
        declared = c["unroutable"] + c["both"]
        line = (
            f"routed {routed} of {len(self.entries)}, declared unroutable {declared}, "
            f"not yet covered {c['missing']}"
        )
        if c["both"]:
            line += f"; {c['both']} both routed and declared unroutable"
        return line


def api_coverage(module: ir.Module, entry_points: TracedApis) -> Coverage:
    """What ``module`` says of each of ``entry_points`` (Note [declared entry points])."""
    by_family: dict[str, list[str]] = {}
    for d in module.definitions:
        by_family.setdefault(d.family, []).append(d.name)
    routes: dict[str, list[Route]] = {}
    untraced: list[Route] = []
    for fam in module.families():
        for keyword, sig in (("api", fam.api), ("plan", fam.plan)):
            if sig is None:
                continue
            route = Route(fam.name, keyword, sig.path, tuple(sorted(by_family.get(fam.name, ()))))
            found = entry_points.lookup(sig.path).api
            if found is None:
                if keyword == "api":
                    untraced.append(route)
            else:
                routes.setdefault(found.path, []).append(route)
    declared: dict[str, ir.Unroutable] = {}
    unknown: list[ir.Unroutable] = []
    for u in module.unroutables():
        found = entry_points.lookup(u.path).api
        if found is None:
            unknown.append(u)
        else:
            declared.setdefault(found.path, u)
    entries = tuple(
        EntryCoverage(api, tuple(routes.get(api.path, ())), declared.get(api.path))
        for api in entry_points.apis
    )
    return Coverage(entry_points.version, entries, tuple(untraced), tuple(unknown))


def route_text(routes: Iterable[Route], path: str | None = None) -> str:
    """How a listing names the families of an entry point: ``gqa_paged_decode_full_pages,
    plan of gqa_paged_decode_partial``; with the path the family spells where it is not the
    entry point's ``path`` (a re-export: ``batch_attention_run as
    flashinfer.attention.BatchAttention.run``), which is how ``list --by-definition`` names it."""
    out = []
    for r in routes:
        text = r.family if r.keyword == "api" else f"plan of {r.family}"
        out.append(text if path is None or r.path == path else f"{text} as {r.path}")
    return ", ".join(out)
