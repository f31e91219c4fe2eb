"""Whether a CUDA graph is being captured on the current stream."""

from __future__ import annotations

import torch


def is_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    # CPU-only torch raises inside is_current_stream_capturing, so ask about CUDA first.
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
