"""The Transformer of one file, one method per grammar rule, and the entry points."""

from __future__ import annotations

from lark import Tree, v_args

from fibgen.compiler import ir
from fibgen.compiler.diagnostics import Diagnostic
from fibgen.compiler.lower.blocks import BlockLowering
from fibgen.compiler.lower.declarations import DeclarationLowering
from fibgen.compiler.lower.instances import InstanceLowering
from fibgen.compiler.lower.statements import FamilyLowering


@v_args(meta=True)
class Lower(FamilyLowering, DeclarationLowering, BlockLowering, InstanceLowering):
    """Lark tree → ir.SourceFile for one file."""


def lower(tree: Tree, path: str) -> tuple[ir.SourceFile, list[Diagnostic]]:
    """Lower one parsed file."""
    source_file, diags, _ = lower_with_comments(tree, path)
    return source_file, diags


def lower_with_comments(
    tree: Tree, path: str
) -> tuple[ir.SourceFile, list[Diagnostic], list[tuple[int, int, str]]]:
    """Lower one parsed file, also returning comments found inside tokens (constraints)."""
    lowering = Lower(path)
    source_file = lowering.transform(tree)
    return source_file, lowering.diagnostics, lowering.comments
