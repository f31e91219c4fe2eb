"""Lower a Lark tree to the family-level IR, one Transformer method per grammar rule.

Lowering checks only what it needs to build well-formed nodes (Python syntax of embedded
expressions and parameter lists, duplicate statements); semantic checks live in checks/.

``Lower`` (``transformer``) is put together from one class per part of the grammar:
``statements`` (the top level and a family's one-line statements), ``declarations`` (params,
axes, tensors), ``blocks`` (constraints and rules) and ``instances``; ``base`` holds what they
share and ``text`` the splitting of text inside tokens.
"""

from fibgen.compiler.lower.text import dedent_block
from fibgen.compiler.lower.transformer import Lower, lower, lower_with_comments

__all__ = ["Lower", "dedent_block", "lower", "lower_with_comments"]
