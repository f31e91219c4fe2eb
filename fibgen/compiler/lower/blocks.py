"""Lowering of statement blocks: constraints and rules (Note [rules] in ``ir.py``)."""

from __future__ import annotations

import re
from typing import cast

from lark import Token, v_args
from lark.tree import Meta

from fibgen.compiler import ir
from fibgen.compiler.lower.base import LowerBase, Stmt
from fibgen.compiler.lower.text import (
    Brackets,
    PosToken,
    make_token,
    split_comment,
    split_statements,
)
from fibgen.compiler.pysyntax import PythonSyntaxError, literal_value


@v_args(meta=True)
class BlockLowering(LowerBase):
    """Constraint and rule blocks, one statement per line or ';'."""

    # ------------------------------------------------------------------ constraints
    def constraints_block(self, meta: Meta, c: list) -> Stmt:
        return Stmt("constraints", self._constraints(c[0]), self._span(meta), "constraints")

    def _constraints(self, block: PosToken) -> tuple[ir.Expr, ...]:
        return tuple(self._expr(tok) for tok in self._block_lines(block))

    def _block_lines(self, block: PosToken) -> list[PosToken]:
        """The statements of a `{ ... }` block token: one per line or per ';'.

        Comments are cut off here and kept for `fibgen fmt`. A statement whose brackets are
        still open at the end of a line goes on over the next lines.
        """
        out: list[PosToken] = []
        text = str(block)[1:-1]
        # An open statement: where it starts, its lines so far, and its open brackets.
        pending: tuple[int, int, list[str], Brackets] | None = None
        for n, line in enumerate(text.split("\n")):
            lineno = block.line + n
            base = (block.column + 1) if n == 0 else 1
            code, hash_at = split_comment(line)
            if hash_at is not None:
                self.comments.append((lineno, base + hash_at, line[hash_at:].rstrip()))
            if pending is not None:
                start_line, start_col, parts, brackets = pending
                parts.append(code.rstrip())
                if brackets.feed("\n" + parts[-1]) > 0:
                    continue
                pending = None
                out.append(make_token("\n".join(parts), start_line, start_col))
                continue
            offset = 0
            pieces = split_statements(code)
            for i, piece in enumerate(pieces):
                stripped = piece.strip()
                if stripped:
                    col = base + offset + (len(piece) - len(piece.lstrip()))
                    brackets = Brackets()
                    if i == len(pieces) - 1 and brackets.feed(stripped) > 0:
                        pending = (lineno, col, [stripped], brackets)
                    else:
                        out.append(make_token(stripped, lineno, col))
                offset += len(piece) + 1
        if pending is not None:
            out.append(make_token("\n".join(pending[2]), pending[0], pending[1]))
        return out

    # ------------------------------------------------------------------ rules
    def rules_block(self, meta: Meta, c: list) -> Stmt:
        rules = tuple(r for r in map(self._rule, self._block_lines(c[0])) if r is not None)
        return Stmt("rules", rules, self._span(meta), "rules")

    def _rule(self, tok: PosToken) -> ir.Rule | None:
        text = str(tok)
        span = self._at(tok.line, tok.column, len(text.split("\n")[0]))
        m = _RULE_KEYWORD.match(text)
        if m is None:
            assignment = _RULE_TARGET.match(text)
            if assignment is not None and assignment.end() < len(text):
                self._error(
                    "a rule is a condition, not an assignment",
                    span,
                    help=f"compare with `==`: `{assignment.group(1)} == "
                    f"{text[assignment.end():].strip()}`; or write `let` to set a value",
                )
                return None
            return ir.Require(expr=self._expr(tok), span=span)
        keyword, rest = m.group(1), m.group(2)
        rest_tok = make_token(rest, tok.line, tok.column + m.start(2))
        if keyword == "ignore":
            return self._ignore(rest_tok, span)
        if keyword in ("default", "let", "result"):
            target = _RULE_TARGET.match(rest)
            if target is None:
                self._error(
                    f"`{keyword}` needs a name and a value",
                    span,
                    help=f"write `{keyword} NAME = EXPRESSION`, e.g. "
                    "`default plan.sm_scale = 1 / sqrt(plan.head_dim)`",
                )
                return None
            name_span = self._at(rest_tok.line, rest_tok.column, len(target.group(1)))
            expr_tok = make_token(
                rest[target.end() :], rest_tok.line, rest_tok.column + target.end()
            )
            cls = {"default": ir.Default, "let": ir.Let, "result": ir.Result}[keyword]
            return cls(
                target=target.group(1),
                target_span=name_span,
                expr=self._expr(expr_tok),
                span=span,
            )
        found = _KEYWORDS_RULE.match(rest)
        if found is None:
            self._error(
                "`keywords` needs a `**` parameter, the function it forwards to and its "
                "keyword parameters",
                span,
                help="write `keywords plan.kwargs = pkg.Class._impl(window_left=-1, ...)`",
            )
            return None
        params_tok = cast(
            PosToken,
            Token(
                "PARAMS",
                found.group(3),
                line=rest_tok.line,
                column=rest_tok.column + found.start(3),
                end_line=rest_tok.line,
                end_column=rest_tok.column + found.end(3),
            ),
        )
        return ir.Keywords(
            target=found.group(1),
            target_span=self._at(rest_tok.line, rest_tok.column, len(found.group(1))),
            path=found.group(2),
            params=self._params(params_tok),
            span=span,
        )

    def _ignore(self, tok: PosToken, span: ir.Span) -> ir.Ignore | None:
        text = str(tok)
        quote_at = text.find('"')
        names_text = text if quote_at < 0 else text[:quote_at]
        reason: str | None = None
        if quote_at >= 0:
            where = self._at(tok.line, tok.column + quote_at, len(text) - quote_at)
            value: object
            try:
                value = literal_value(text[quote_at:].strip())
            except PythonSyntaxError:
                value = None
            if not isinstance(value, str):
                self._error(
                    "the reason of `ignore` must be one string",
                    where,
                    help='write `ignore enable_pdl "a launch option"`',
                )
                return None
            reason = value
            if not self._encodable(reason, "the reason of `ignore`", where):
                return None
        names: list[str] = []
        spans: list[ir.Span] = []
        offset = 0
        for part in names_text.split(","):
            name = part.strip()
            col = tok.column + offset + (len(part) - len(part.lstrip()))
            offset += len(part) + 1
            if not _RULE_NAME.fullmatch(name):
                self._error(
                    f"`{name}` is not a parameter name" if name else "`ignore` names nothing",
                    self._at(tok.line, col, max(1, len(name))),
                    help='write `ignore NAME, plan.NAME ... "why"`',
                )
                return None
            names.append(name)
            spans.append(self._at(tok.line, col, len(name)))
        return ir.Ignore(names=tuple(names), name_spans=tuple(spans), reason=reason, span=span)


_RULE_KEYWORD = re.compile(r"(ignore|default|let|result|keywords)\b\s*(.*)\Z", re.S)
_RULE_NAME = re.compile(r"(?:plan\.)?[A-Za-z_][A-Za-z0-9_]*")
_RULE_TARGET = re.compile(r"((?:plan\.)?[A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)\s*")
_KEYWORDS_RULE = re.compile(
    r"((?:plan\.)?[A-Za-z_][A-Za-z0-9_]*)\s*=\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(\(.*\))\s*\Z", re.S
)
