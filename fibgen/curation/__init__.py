"""Dataset curation: a dataset's workloads (read, made, written) and checks of a whole dataset.

Where it sits: above the runtime, whose input generation (``fibgen.runtime.inputs.make``) makes
the values of workloads and whose solution loader ``validate --load`` uses; below ``bench``,
which reads workloads through it, and the command line. It imports nothing of the compiler
or the code generator.

The runtime never imports it. Tracing, which is part of the runtime, writes the workloads of
live calls, so the primitives of writing workloads into a dataset (``workload_path``,
``blob_relpath``, ``write_workloads``, ``save_blob``) are the dataset layout's I/O, in
``fibgen.format.dataset``, below both; what is here builds on them.

- ``workloads``: a dataset's workloads, loaded and turned into the inputs of a definition;
- ``synthetic``: workloads over a grid of var-axis values, written into a dataset;
- ``validate``: check every file of a dataset (``fibgen validate``), with one module per
  kind of check (``check_files``, ``check_solutions``, ``check_workloads``,
  ``check_traces``) and ``findings``, what they find and its table.

This package imports nothing at import time: ``validate`` needs no torch, ``workloads`` does.
"""
