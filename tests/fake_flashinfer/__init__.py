"""A stand-in for flashinfer: a few APIs with its calling conventions, and a record of calls.

``CALLS`` lists the name of every original API called, so tests can tell a fallback from a
routed call. ``rmsnorm`` is re-exported here, as flashinfer does, to test alias patching.
"""

from fake_flashinfer import activation, decode, fused_moe, norm
from fake_flashinfer.calls import CALLS
from fake_flashinfer.norm import fused_add_rmsnorm, rmsnorm

__all__ = ["CALLS", "activation", "decode", "fused_add_rmsnorm", "fused_moe", "norm", "rmsnorm"]
