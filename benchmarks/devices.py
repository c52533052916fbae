"""What the GPU benchmarks say about the device they ran on, and how they time it."""

from __future__ import annotations

import os


def device_name() -> str:
    """torch.cuda.get_device_name of the first GPU, else "cpu (N cores)"."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"cpu ({os.cpu_count()} cores)"


def synchronize() -> None:
    """Wait for queued CUDA work, so a wall-clock window covers it (no-op on CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
