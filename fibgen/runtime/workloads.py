"""Facade: workloads moved to ``fibgen.curation`` (dataset curation, above the runtime).

Reading a dataset's workloads and turning them into inputs is ``fibgen.curation.workloads``;
making synthetic ones is ``fibgen.curation.synthetic``. Nothing in the runtime imports this
module; it stays so that ``fibgen.runtime.workloads`` keeps working for code that imports it.
"""

from __future__ import annotations

from fibgen.curation.synthetic import SyntheticResult, parse_grid, synthesize, write_synthetic
from fibgen.curation.workloads import WorkloadError, input_spec, load_workloads, materialize

__all__ = [
    "SyntheticResult",
    "WorkloadError",
    "input_spec",
    "load_workloads",
    "materialize",
    "parse_grid",
    "synthesize",
    "write_synthetic",
]
