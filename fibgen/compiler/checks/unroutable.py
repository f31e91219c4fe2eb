"""Checks of `unroutable` declarations (Note [declared entry points] in ``ir.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fibgen.compiler import ir
from fibgen.compiler.checks.common import CheckerBase

if TYPE_CHECKING:
    from fibgen.format.fi_apis import TracedApis

# The package whose traced entry points a declaration names.
PACKAGE = "flashinfer"


class UnroutableChecks(CheckerBase):
    """One declaration per entry point, with a reason, for an entry point no family routes;
    a path that FlashInfer's source (when given) has no traced entry point for."""

    # Called once, where the files declare an unroutable entry point: FlashInfer's traced
    # entry points, or None where its source is not at hand (paths are then compared as
    # written).
    entry_points_of: Callable[[], TracedApis | None] | None = None
    entry_points: TracedApis | None = None

    def _entry_key(self, path: str) -> str:
        """The entry point a path names (FlashInfer's name for it) where the source is
        given and it resolves; else the path as written."""
        if self.entry_points is not None:
            found = self.entry_points.lookup(path).api
            if found is not None:
                return found.path
        return path

    def unroutables(self, files: list[ir.SourceFile], families: dict[str, ir.Family]) -> None:
        names_package = any(
            sig is not None and sig.path.partition(".")[0] == PACKAGE
            for fam in families.values()
            for sig in (fam.api, fam.plan)
        )
        if not names_package and not any(sf.unroutables for sf in files):
            return
        if self.entry_points_of is not None:
            self.entry_points = self.entry_points_of()
        self._api_paths(families)
        routed: dict[str, tuple[ir.Family, str, ir.ApiSignature]] = {}
        for fam in families.values():
            for keyword, sig in (("api", fam.api), ("plan", fam.plan)):
                if sig is not None:
                    routed.setdefault(self._entry_key(sig.path), (fam, keyword, sig))
        seen: dict[str, ir.Unroutable] = {}
        for sf in files:
            for u in sf.unroutables:
                self._unroutable(u, routed, seen)

    def _api_paths(self, families: dict[str, ir.Family]) -> None:
        """A family's `api` or `plan` path that names nothing FlashInfer's source defines (a
        misspelt name): a warning, since apply leaves such a path unpatched and says so only
        when enabled. A function FlashInfer defines without a trace template (every
        wrapper's ``plan``) is routed like any other, and not warned about."""
        if self.entry_points is None:
            return
        for fam in families.values():
            for keyword, sig in (("api", fam.api), ("plan", fam.plan)):
                if sig is None or sig.path.partition(".")[0] != PACKAGE:
                    continue
                found = self.entry_points.lookup(sig.path)
                if found.api is not None or found.defined:
                    continue
                close = self.entry_points.closest(sig.path)
                self.warn(
                    f"family `{fam.name}`'s `{keyword}` path `{sig.path}` names nothing "
                    f"flashinfer {self.entry_points.version} defines",
                    sig.span,
                    help=f"did you mean `{close[0]}`?" if close else None,
                )

    def _untraced(self, path: str) -> str | None:
        """Why ``path`` is no traced entry point of FlashInfer's source, with the closest
        ones; None where it is one."""
        assert self.entry_points is not None
        found = self.entry_points.lookup(path)
        if found.api is not None:
            return None
        close = self.entry_points.closest(path)
        return f"it {found.problem}" + (f"; did you mean `{close[0]}`?" if close else "")

    def _unroutable(
        self,
        u: ir.Unroutable,
        routed: dict[str, tuple[ir.Family, str, ir.ApiSignature]],
        seen: dict[str, ir.Unroutable],
    ) -> None:
        if not u.reason.strip():
            self.err(
                f"`unroutable {u.path}` gives no reason",
                u.span,
                help='say why no family can route it, e.g. "a collective over several '
                'ranks: no single process computes its result"',
            )
        key = u.path
        if u.path.partition(".")[0] != PACKAGE:
            self.err(
                f"`{u.path}` is not an entry point of FlashInfer",
                u.path_span,
                help=f"`unroutable` declares one of FlashInfer's traced API entry points, a path "
                f"in `{PACKAGE}`",
            )
            return
        if self.entry_points is not None:
            why = self._untraced(u.path)
            if why is not None:
                self.err(
                    f"`{u.path}` is not a traced entry point of flashinfer "
                    f"{self.entry_points.version}",
                    u.path_span,
                    help=why,
                )
                return
            key = self._entry_key(u.path)
        first = seen.get(key)
        if first is not None:
            spelled = f" (as `{first.path}`)" if first.path != u.path else ""
            self.err(
                f"`{u.path}` is declared unroutable twice",
                u.path_span,
                help=f"the first declaration is at {first.span}{spelled}; keep one",
            )
            return
        seen[key] = u
        if key in routed:
            fam, keyword, sig = routed[key]
            spelled = f" as `{sig.path}`" if sig.path != u.path else ""
            self.err(
                f"`{u.path}` is routed by family `{fam.name}`",
                u.path_span,
                help=f"its `{keyword}` line at {sig.span} names it{spelled}; an entry point is "
                "routed or declared unroutable, not both: remove this declaration, or the "
                "family's line if it cannot route",
            )
