"""Semantic checks and instantiation: families → concrete definitions.

Every check reports with its own message and the span of the thing to edit. Checks never stop
at the first problem: a family with errors still yields as many diagnostics as can be found,
and no definitions.

``Checker`` (``checker``) runs them in order; each module checks one thing: ``declarations``
(axes, parameters, tensors, dtypes, hints, constraints), ``api`` (what the family reads from
its API and writes back), ``returns``, ``reference``, ``rules``, ``dispatch`` (dispatch
groups), ``variants`` (families that stand for one API) and ``instances`` (values, names,
the definitions built; derived consts in ``const_eval``, what a family, dispatch group or
definition may be called in ``names``).
"""

from fibgen.compiler.checks.checker import Checker
from fibgen.compiler.checks.common import EXPR_BUILTINS
from fibgen.compiler.checks.const_eval import INT64_MAX
from fibgen.compiler.checks.instances import definition_name

__all__ = ["EXPR_BUILTINS", "INT64_MAX", "Checker", "definition_name"]
