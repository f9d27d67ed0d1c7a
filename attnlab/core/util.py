"""Small helpers shared by every layer: tensors from array-likes, progress bars, torch thread counts,
and an empty row of matplotlib axes. No science here."""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterable, Optional

import numpy as np
import torch


def as_float64(x, *, dtype=torch.float64, device=None) -> torch.Tensor:
    """Any array-like -> torch tensor of `dtype` on `device` (a tensor keeps its device if None)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(dtype=dtype, device=device if device is not None else x.device)
    return torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=dtype, device=device)


def progress(iterable: Iterable, show: bool, desc: str, total: Optional[int] = None) -> Iterable:
    """`iterable` wrapped in a tqdm bar (notebook or terminal) when `show`, else unchanged."""
    if not show:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False)


@contextlib.contextmanager
def threads(n: Optional[int]):
    """Context manager: torch intra-op threads = n inside (None: unchanged). On a busy shared CPU one
    thread can be several times faster than two (OpenMP threads wait for each other)."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def with_threads(fn: Callable) -> Callable:
    """Decorator: run `fn` under `threads(kwargs["threads"])` (the `threads` protocol option)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with threads(kwargs.get("threads")):
            return fn(*args, **kwargs)
    return wrapper


def figure_row(ncols: int, width: float, height: float):
    """(Figure, axes [ncols]): one row of axes, `width` x `height` inches each, constrained layout,
    no pyplot state (works under Agg, in notebooks and in the CLI)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes
