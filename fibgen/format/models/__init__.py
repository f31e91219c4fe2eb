"""The FlashInfer Trace data model: Definition, Solution, Workload, Trace and Evaluation.

One module per record (``definition``, ``solution``, ``trace``), on a shared ``base``, with
the rule for safe names in ``names``; everything is importable from here.

These models accept and reject what flashinfer-bench 0.1.2's own models accept and reject
(their JSON Schemas are in ``shared/reference/schemas``), with these deliberate differences:

* unknown keys are ignored, as flashinfer-bench ignores them (a file written by a newer
  version still loads), but not silently: ``strip_unknown_keys`` removes them before
  validation and the loaders in ``fibgen.format.jsonio`` warn with each key's place, so a
  misspelt ``"dtpye"`` is still reported. The models themselves forbid extra keys, so an
  object built in code cannot carry one;
* ``axes`` and workload ``inputs`` are unions tagged by ``"type"``, and the tag is required;
* a tensor may carry FlashInfer's ``"optional": true`` extension, which is kept;
* the names of definitions, op_types, solutions and authors are safe names (see Note [safe
  names]): each becomes a folder or file name in a dataset and in generated code.

Every cross-field check collects all of its problems before raising, so one load of a broken
file lists everything a curator has to fix. This package imports only pydantic and the
standard library: the runtime imports it on its hot start-up path.
"""

from fibgen.format.models.base import (
    DTYPE_BYTES,
    DTYPES,
    LANGUAGES,
    Binding,
    DType,
    Language,
    NonEmptyStr,
)
from fibgen.format.models.definition import (
    Axis,
    AxisConst,
    AxisVar,
    Definition,
    TensorSpec,
    constraint_problems,
    reference_problems,
    var_axis_scalars,
)
from fibgen.format.models.names import MAX_NAME_LENGTH, NAME_RULE, name_problem
from fibgen.format.models.solution import BuildSpec, Solution, SourceFile, source_path_problem
from fibgen.format.models.trace import (
    Correctness,
    Environment,
    Evaluation,
    EvaluationStatus,
    InputSpec,
    Performance,
    RandomInput,
    SafetensorsInput,
    ScalarInput,
    Trace,
    Workload,
    workload_problems,
)
from fibgen.format.schema_walk import allowed_keys_at, strip_union_tags, strip_unknown_keys

__all__ = [
    "DTYPES",
    "DTYPE_BYTES",
    "LANGUAGES",
    "MAX_NAME_LENGTH",
    "NAME_RULE",
    "Axis",
    "AxisConst",
    "AxisVar",
    "Binding",
    "BuildSpec",
    "Correctness",
    "DType",
    "Definition",
    "Environment",
    "Evaluation",
    "EvaluationStatus",
    "InputSpec",
    "Language",
    "NonEmptyStr",
    "Performance",
    "RandomInput",
    "SafetensorsInput",
    "ScalarInput",
    "Solution",
    "SourceFile",
    "TensorSpec",
    "Trace",
    "Workload",
    "constraint_problems",
    "name_problem",
    "reference_problems",
    "var_axis_scalars",
    "source_path_problem",
    "workload_problems",
    # The annotation walker lived here; fibgen.format.schema_walk holds it now.
    "allowed_keys_at",
    "strip_union_tags",
    "strip_unknown_keys",
]
