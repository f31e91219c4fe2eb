"""Session-wide test settings for tests/ and generated/tests/."""

import os

import torch

# Without a GPU, Triton kernels run under Triton's interpreter. The choice is made when a
# kernel is decorated, so it must hold from the start of the session: a kernel module imported
# by one test before another test set it would otherwise mix compiled and interpreted kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The native result check (Note [result check] in fibgen/runtime/result_check.py) is built in
# the background on the first value-returning hit of a process. Tests that point
# FIBGEN_CACHE_DIR at a temporary folder would each build it again; its own tests build it.
os.environ.setdefault("FIBGEN_NATIVE", "0")
