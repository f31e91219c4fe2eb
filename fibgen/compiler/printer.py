"""Print the family-level IR back to canonical `.fidef` text (the other half of `parse`).

Canonical form: two-space indent, statements in a fixed order, names aligned in axes, params
and tensor blocks, one instance per line with aligned columns, references as indented
triple-quoted blocks. Comments are carried over: a comment on its own line stays before the
node that followed it; a comment after code stays at the end of that node's line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from fibgen.compiler import ir

_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-+/]*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEYWORDS = frozenset({"true", "false", "True", "False"})


def quote(text: str) -> str:
    """A double-quoted string literal that the grammar reads back to the same text."""
    return json.dumps(text, ensure_ascii=False)


def _tag(tag: str) -> str:
    return tag if _TAG.match(tag) else quote(tag)


def _tags(tags: tuple[str, ...]) -> str:
    return "[" + ", ".join(_tag(t) for t in tags) + "]"


def number(value: int | float) -> str:
    """How `fibgen fmt` spells a number: Python's shortest repr, with the exponent written
    without a '+' or leading zeros (`1e-6`, `1e16`; repr gives `1e-06`, `1e+16`)."""
    text = repr(value)
    if isinstance(value, float) and "e" in text:
        mantissa, exponent = text.split("e")
        sign = "-" if exponent.startswith("-") else ""
        text = f"{mantissa}e{sign}{exponent.lstrip('+-').lstrip('0') or '0'}"
    return text


def value_text(value: int | float | str | bool) -> str:
    """How `fibgen fmt` writes an instance value, a param default or a selector value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return number(value)
    if _NAME.match(value) and value not in _KEYWORDS:
        return value
    return quote(value)


def _params(params: tuple[ir.ApiParam, ...]) -> str:
    parts: list[str] = []
    star_written = False
    for p in params:
        default = f"={p.default}" if p.default is not None else ""
        if p.kind == "positional":
            parts.append(p.name + default)
        elif p.kind == "var_positional":
            parts.append("*" + p.name)
            star_written = True
        elif p.kind == "keyword_only":
            if not star_written:
                parts.append("*")
                star_written = True
            parts.append(p.name + default)
        else:
            parts.append("**" + p.name)
    return "(" + ", ".join(parts) + ")"


def _dtype(ref: ir.DtypeRef) -> str:
    return f"dtype({ref.name})" if ref.kind == "from" else ref.name


def _shape(shape: tuple[str, ...] | None) -> str:
    return " scalar" if shape is None else "[" + ", ".join(shape) + "]"


def _hint(h: ir.GenHint) -> str:
    args = [e.text for e in h.args] + [f"{k}={e.text}" for k, e in h.kwargs]
    return f"gen {h.kind}({', '.join(args)})"


def _source(s: ir.Source) -> str:
    text = ("plan." if s.from_plan else "") + s.param
    return f"<- {text}" + (f"[{s.index}]" if s.index is not None else "")


def _rule(r: ir.Rule) -> str:
    if isinstance(r, ir.Require):
        return r.expr.text
    if isinstance(r, ir.Ignore):
        return f"ignore {', '.join(r.names)}" + (
            f" {quote(r.reason)}" if r.reason is not None else ""
        )
    if isinstance(r, (ir.Default, ir.Let, ir.Result)):
        return f"{r.kind} {r.target} = {r.expr.text}"
    return f"keywords {r.target} = {r.path}{_params(r.params)}"


def long_string(text: str, indent: str) -> str:
    """A triple-quoted block that `lower.dedent_block` reads back to exactly `text`."""
    quote3 = '"""' if '"""' not in text else "'''"
    body = "\n".join((indent + "  " + line) if line else "" for line in text.split("\n"))
    return f"{quote3}\n{body}\n{indent}{quote3}"


@dataclass
class _Comments:
    """Comments assigned to the node they belong with, keyed by the node's position."""

    leading: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    trailing: dict[tuple[int, int], str] = field(default_factory=dict)
    rest: list[str] = field(default_factory=list)


def _assign_comments(
    comments: list[tuple[int, int, str]], text: str, anchors: list[tuple[int, int]]
) -> _Comments:
    lines = text.split("\n")  # as the lexer counts lines: a string may hold '\x0c' or '\u2028'
    out = _Comments()
    anchors = sorted(set(a for a in anchors if a[0] > 0))
    previous: int | None = None  # the line of the last comment on a line of its own
    for line, column, body in comments:
        own_line = not lines[line - 1][: column - 1].strip() if line <= len(lines) else True
        if own_line:
            nxt = next((a for a in anchors if a[0] > line), None)
            group = out.rest if nxt is None else out.leading.setdefault(nxt, [])
            # Paragraphs of comments stay paragraphs: one blank line where the source has
            # only blank lines between two comments of the same place.
            between = lines[previous : line - 1] if previous is not None else []
            if group and between and not any(x.strip() for x in between):
                group.append("")
            group.append(body)
            previous = line
        else:
            on_line = [a for a in anchors if a[0] == line and a[1] < column]
            if on_line:
                out.trailing[max(on_line)] = body
            else:
                prev = [a for a in anchors if a[0] < line]
                key = max(prev) if prev else None
                if key is None:
                    out.rest.append(body)
                else:
                    out.trailing[key] = (out.trailing.get(key, "") + " " + body).strip()
    return out


def _anchors(sf: ir.SourceFile) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []

    def add(node: ir.Node | None) -> None:
        if node is not None and node.span.line > 0:
            found.append((node.span.line, node.span.column))

    for fam in sf.families:
        add(fam)
        for node in (fam.api, fam.returns, fam.plan, fam.tolerance):
            add(node)
        for seq in (
            fam.effects,
            fam.rules,
            fam.dtype_params,
            fam.params,
            fam.axes,
            fam.constraints,
            fam.inputs,
            fam.outputs,
            fam.instances,
        ):
            for item in seq:
                add(item)
        if fam.reference_span.line > 0:
            found.append((fam.reference_span.line, fam.reference_span.column))
    for group in sf.dispatches:
        add(group)
        for case in group.cases:
            add(case)
    for u in sf.unroutables:
        add(u)
    return found


class Printer:
    """Builds the canonical text of one file."""

    def __init__(self, comments: _Comments) -> None:
        self.comments = comments
        self.lines: list[str] = []

    def _key(self, span: ir.Span) -> tuple[int, int]:
        return (span.line, span.column)

    def emit(self, indent: str, text: str, span: ir.Span | None = None) -> None:
        if span is not None:
            for c in self.comments.leading.pop(self._key(span), []):
                self.lines.append(indent + c if c else "")
            trailing = self.comments.trailing.pop(self._key(span), None)
            if trailing:
                # After the last line: a node of several lines ends a triple-quoted block,
                # and a comment on its first line would be inside the string.
                *head, last = text.split("\n")
                text = "\n".join(head + [f"{last}  {trailing}"])
        self.lines.append(indent + text if text else "")

    def blank(self) -> None:
        if self.lines and self.lines[-1] != "":
            self.lines.append("")

    def file(self, sf: ir.SourceFile) -> str:
        for fam in sf.families:
            self.blank()
            self.family(fam)
        for group in sf.dispatches:
            self.blank()
            self.dispatch(group)
        for index, u in enumerate(sf.unroutables):
            # One declaration a line; a comment of its own line above one starts a paragraph
            # (declarations of a kind under a heading), as does what comes before the first.
            if index == 0 or self._key(u.span) in self.comments.leading:
                self.blank()
            self.emit("", f"unroutable {u.path} {quote(u.reason)}", u.span)
        if self.comments.rest:
            self.blank()
            self.lines.extend(self.comments.rest)
        while self.lines and self.lines[0] == "":
            self.lines.pop(0)
        return "\n".join(self.lines).rstrip("\n") + "\n"

    def family(self, fam: ir.Family) -> None:
        self.emit("", f"family {fam.name} {{", fam.span)
        i = "  "
        self.emit(i, f"op_type {fam.op_type}")
        if fam.description is not None:
            self.emit(i, f"description {quote(fam.description)}")
        if fam.tags:
            self.emit(i, f"tags {_tags(fam.tags)}")
        if fam.name_template is not None:
            self.emit(i, f"name {quote(fam.name_template)}")
        if fam.api is not None:
            self.emit(i, f"api {fam.api.path}{_params(fam.api.params)}", fam.api.span)
        if fam.no_api is not None:
            self.emit(i, f"api none {quote(fam.no_api)}")
        if fam.returns is not None:
            names = ", ".join(fam.returns.names) or "none"
            self.emit(i, f"returns {names}", fam.returns.span)
        for e in fam.effects:
            self.emit(i, f"effect {e.target} = {e.expr.text}", e.span)
        if fam.plan is not None:
            self.emit(i, f"plan {fam.plan.path}{_params(fam.plan.params)}", fam.plan.span)
        for dp in fam.dtype_params:
            self.emit(i, f"dtype {dp.name} in {{{', '.join(dp.choices)}}}", dp.span)
        if fam.requires:
            self.emit(i, f"requires {', '.join(fam.requires)}")
        if fam.tolerance is not None:
            t = fam.tolerance
            args = [
                f"{k}={number(getattr(t, k))}"
                for k in ("atol", "rtol", "matched")
                if getattr(t, k) is not None
            ]
            self.emit(i, f"tolerance({', '.join(args)})", t.span)
        if fam.rules:
            self.blank()
            self.token_block(i, "rules", [(_rule(r), r.span) for r in fam.rules])
        if fam.params:
            self.blank()
            self.block(
                i, "params", [self._param_cols(p) for p in fam.params], [p.span for p in fam.params]
            )
        if fam.axes:
            self.blank()
            self.block(
                i, "axes", [self._axis_cols(a) for a in fam.axes], [a.span for a in fam.axes]
            )
        if fam.constraints:
            self.blank()
            self.token_block(i, "constraints", [(c.text, c.span) for c in fam.constraints])
        for title, tensors in (("inputs", fam.inputs), ("outputs", fam.outputs)):
            if tensors:
                self.blank()
                self.block(
                    i, title, [self._tensor_cols(t) for t in tensors], [t.span for t in tensors]
                )
        if fam.reference is not None:
            self.blank()
            self.emit(i, "reference " + long_string(fam.reference, i), fam.reference_span)
        if fam.instances:
            self.blank()
            self.instances(i, fam.instances)
        self.emit("", "}")

    def _param_cols(self, p: ir.Param) -> list[str]:
        default = f"= {value_text(p.default)}" if p.default is not None else ""
        middle = " ".join(part for part in (p.abbrev or "", default) if part)
        return [p.name, middle, quote(p.description) if p.description is not None else ""]

    def _axis_cols(self, a: ir.VarAxis | ir.ConstAxis) -> list[str]:
        if isinstance(a, ir.VarAxis):
            kind = "var scalar" if a.scalar else "var"
        else:
            kind = "const" + (f" {a.abbrev}" if a.abbrev else "")
            kind += f" = {a.value.text}" if a.value is not None else ""
        return [a.name, ":", kind, quote(a.description) if a.description is not None else ""]

    def _tensor_cols(self, t: ir.Tensor) -> list[str]:
        kind = ("optional " if t.optional else "") + _dtype(t.dtype) + _shape(t.shape)
        extras = []
        if t.source is not None:
            extras.append(_source(t.source))
        if t.target is not None:
            extras.append(f"-> {t.target}")
        if t.gen is not None:
            extras.append(_hint(t.gen))
        if t.description is not None:
            extras.append(quote(t.description))
        # Names and colons align; the rest of a tensor line is too varied for columns.
        return [t.name, ":", " ".join([kind] + extras)]

    def token_block(self, indent: str, title: str, lines: list[tuple[str, ir.Span]]) -> None:
        """A `constraints` or `rules` block, which the grammar reads as one token."""
        # The token cannot hold a brace, not even in a comment: such a comment, assigned to
        # a line of the block, goes above the block instead.
        for _, span in lines:
            key = self._key(span)
            lead = self.comments.leading.get(key, [])
            for text in [t for t in lead if "{" in t or "}" in t]:
                lead.remove(text)
                self.emit(indent, text)
            if any(b in self.comments.trailing.get(key, "") for b in "{}"):
                self.emit(indent, self.comments.trailing.pop(key))
        self.emit(indent, f"{title} {{")
        for text, span in lines:
            self.emit(indent + "  ", text, span)
        self.emit(indent, "}")

    def block(self, indent: str, title: str, rows: list[list[str]], spans: list[ir.Span]) -> None:
        self.emit(indent, f"{title} {{")
        for line, span in zip(_align(rows), spans):
            self.emit(indent + "  ", line, span)
        self.emit(indent, "}")

    def instances(self, indent: str, instances: tuple[ir.Instance, ...]) -> None:
        self.emit(indent, "instances {")
        rows = []
        for inst in instances:
            row = [f"{a.key}={value_text(a.value)}" for a in inst.values]
            tail = []
            if inst.tags:
                tail.append(f"tags {_tags(inst.tags)}")
            if inst.description is not None:
                tail.append(quote(inst.description))
            rows.append((row, " ".join(tail)))
        width = max(len(r) for r, _ in rows)
        grid = [r + [""] * (width - len(r)) + [t] for r, t in rows]
        for line, inst in zip(_align(grid), instances):
            if inst.reference is not None:
                line += " reference " + long_string(inst.reference, indent + "  ")
            self.emit(indent + "  ", line, inst.span)
        self.emit(indent, "}")

    def dispatch(self, group: ir.DispatchGroup) -> None:
        self.emit("", f"dispatch {group.name} on {group.selector} {{", group.span)
        rows = [
            [
                value_text(c.value) if not isinstance(c.value, str) else quote(c.value),
                "->",
                ", ".join(c.families),
            ]
            for c in group.cases
        ]
        for line, case in zip(_align(rows), group.cases):
            self.emit("  ", line, case.span)
        self.emit("", "}")


def _align(rows: list[list[str]]) -> list[str]:
    """Join columns, padding each to its widest cell; empty trailing cells add nothing."""
    if not rows:
        return []
    ncol = max(len(r) for r in rows)
    rows = [r + [""] * (ncol - len(r)) for r in rows]
    widths = [max(len(r[c]) for r in rows) for c in range(ncol)]
    out = []
    for r in rows:
        last = max((c for c in range(ncol) if r[c]), default=0)
        cells = [r[c].ljust(widths[c]) if c < last else r[c] for c in range(last + 1)]
        out.append(" ".join(cells).rstrip())
    return out


def print_file(
    sf: ir.SourceFile, comments: Sequence[tuple[int, int, str]] = (), text: str = ""
) -> str:
    """Canonical text of one parsed file, with its comments."""
    assigned = _assign_comments(list(comments), text, _anchors(sf))
    return Printer(assigned).file(sf)
