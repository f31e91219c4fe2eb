"""The on-disk layout of a FlashInfer Trace dataset: paths, loaders and atomic writers.

One module per job: ``layout`` (where each record lies; Note [dataset depth]), ``loaders``,
``writers`` (Note [torn lines]), ``solution_folders`` (Note [solution folders]), ``sidecars``
and ``blobs``; everything is importable from here.

Writers replace files atomically (a temporary file in the same directory, then
``os.replace``), so a reader never sees half a file. torch and safetensors are imported only
by the blob functions.
"""

from fibgen.format.dataset.blobs import load_blob, load_safetensors_input, save_blob
from fibgen.format.dataset.layout import (
    DATASET_FOLDERS,
    PathLike,
    blob_path,
    blob_relpath,
    dataset_files,
    definition_path,
    inside_dataset,
    resolve_dataset_path,
    solution_path,
    trace_path,
    workload_path,
)
from fibgen.format.dataset.loaders import (
    iter_records,
    iter_traces,
    load_definition_files,
    load_definitions,
    load_solution_files,
    load_solutions,
    load_traces,
    load_workloads,
)
from fibgen.format.dataset.sidecars import EXTRAS_SUFFIX, dump_extras, read_extras, sidecar_path
from fibgen.format.dataset.solution_folders import (
    Packed,
    folder_root,
    folder_sources,
    is_solution_folder,
    is_stale,
    pack_solution,
    read_solution,
)
from fibgen.format.dataset.writers import (
    append_lines_atomic,
    append_traces,
    append_workloads,
    drop_torn_last_line,
    write_bytes_atomic,
    write_definition,
    write_solution,
    write_text_atomic,
    write_workloads,
)

__all__ = [
    "DATASET_FOLDERS",
    "EXTRAS_SUFFIX",
    "Packed",
    "PathLike",
    "append_lines_atomic",
    "append_traces",
    "append_workloads",
    "blob_path",
    "blob_relpath",
    "dataset_files",
    "definition_path",
    "drop_torn_last_line",
    "dump_extras",
    "folder_root",
    "folder_sources",
    "inside_dataset",
    "is_solution_folder",
    "is_stale",
    "iter_records",
    "iter_traces",
    "load_blob",
    "load_definition_files",
    "load_definitions",
    "load_safetensors_input",
    "load_solution_files",
    "load_solutions",
    "load_traces",
    "load_workloads",
    "pack_solution",
    "read_extras",
    "read_solution",
    "resolve_dataset_path",
    "save_blob",
    "sidecar_path",
    "solution_path",
    "trace_path",
    "workload_path",
    "write_bytes_atomic",
    "write_definition",
    "write_solution",
    "write_text_atomic",
    "write_workloads",
]
