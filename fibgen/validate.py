"""Facade: dataset validation moved to ``fibgen.curation`` (``validate``, ``findings``).

It stays so that ``fibgen.validate`` keeps working for code that imports it.
"""

from __future__ import annotations

from fibgen.curation.findings import Problem, Report, Row, render
from fibgen.curation.validate import validate_dataset

__all__ = ["Problem", "Report", "Row", "render", "validate_dataset"]
