"""Functions that the rules of a `.fidef` family may call (Note [rules] in the compiler's IR).

They convert an API's argument to what the definition reads, by views where they can, or
say what an argument stands for where its value alone does not.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from fibgen.runtime.launch import capture as _capture


def kv_pair(cache: Any, layout: str = "NHD") -> tuple[torch.Tensor, torch.Tensor]:
    """(k, v) of a paged KV cache as views in NHD order: [pages, page_size, heads, dim].

    FlashInfer takes the cache as one tensor [pages, 2, ...] or as a (k, v) tuple, each in
    the layout its wrapper was built with: NHD [pages, page_size, heads, dim] or HND
    [pages, heads, page_size, dim].
    """
    if isinstance(cache, torch.Tensor):
        if cache.ndim != 5 or cache.shape[1] != 2:
            raise ValueError(f"a paged KV cache tensor is [pages, 2, ...], not {list(cache.shape)}")
        k, v = cache[:, 0], cache[:, 1]
    else:
        k, v = cache
    if layout == "HND":
        return k.transpose(-3, -2), v.transpose(-3, -2)
    if layout != "NHD":
        raise ValueError(f"unknown KV layout {layout!r}")
    return k, v


_FROM_ENVIRONMENT = object()


def nvfp4_4over6_off(setting: Any = _FROM_ENVIRONMENT) -> bool:
    """Whether FlashInfer's ``nvfp4_4over6=`` argument leaves its NVFP4 recipe standard.

    ``None`` turns the "4over6" scale search off; a config turns it on; the default, an
    unset sentinel, defers to the environment variable ``FLASHINFER_NVFP4_4OVER6`` (on when
    it is ``"1"``), as FlashInfer 0.7.2's ``resolve_nvfp4_4over6`` reads it at each call.
    Without an argument, for an API that has no ``nvfp4_4over6=`` and whose quantizer reads
    the environment alone, the environment decides.
    """
    if setting is None:
        return True
    if setting is _FROM_ENVIRONMENT or type(setting).__name__ == "_UnsetType":
        return os.environ.get("FLASHINFER_NVFP4_4OVER6") != "1"
    return False


def capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream.

    A rule that reads tensor values on the host (``.all()``, ``.item()``) would synchronize,
    which capture forbids and which breaks the capture: such a rule is written
    ``not capturing() and <check>``, so that inside capture the call falls back to the
    original API, counted by the rule, without reading anything (Note [data rules in
    capture] in the compiler's rules).
    """
    return _capture.is_capturing()
