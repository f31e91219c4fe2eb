"""Steps that span the compiler, the code generator and the layers below them.

What neither the compiler nor the code generator may do alone (one may not import the
other), and what the command line calls rather than holds:

- ``importing``: `fibgen import`, whose families are checked by compiling them and dumping
  every definition again (``import_paths``);
- ``workload_definitions``: the definition `fibgen workloads` makes inputs for, from
  `.fidef` sources, a dataset or the built-in catalogue, written into the dataset with its
  sidecar.
"""

from __future__ import annotations

from fibgen.pipeline.importing import import_paths

__all__ = ["import_paths"]
