"""Small helpers shared by every layer: tensors from array-likes, progress bars, torch thread counts,
and an empty row of matplotlib axes. No science here."""
from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np
import torch


def as_float64(x, *, dtype=torch.float64, device=None) -> torch.Tensor:
    """Any array-like -> torch tensor of `dtype` on `device` (a tensor keeps its device if None)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(dtype=dtype, device=device if device is not None else x.device)
    return torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=dtype, device=device)


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes so that readers never see a half-written file: a unique temporary file in the same
    folder, then `os.replace` (atomic). Two writers never share a temporary file; the last replace wins.
    The file gets the usual permissions (0666 less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def writable_dir(path, what: str = "--out") -> Path:
    """`path` as a folder that exists and can be written (created if missing), checked before any work;
    a ValueError says what is wrong and what to do."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"{what} {str(path)!r} exists and is not a directory: choose another path")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".attnlab-write-test-"):
            pass
    except OSError as exc:
        why = exc.strerror or exc
        raise ValueError(f"{what} {str(path)!r} cannot be written ({why}): choose another path") from None
    return out


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


#: widest figure (inches) the book's column shows at its own size at 100 dpi (688 px on a 1280 px screen)
MAX_FIGURE_WIDTH = 6.8


def figure_grid(n: int, width: float, height: float, *, max_width: float = MAX_FIGURE_WIDTH, **subplots):
    """(Figure, axes [n]): n panels of `width` x `height` inches, as many per row as fit in `max_width`
    (one row if they all fit, else stacked), constrained layout, no pyplot state (works under Agg, in
    notebooks and in the CLI). A panel wider than `max_width` is narrowed to it."""
    import math

    from matplotlib.figure import Figure

    width = min(width, max_width)
    cols = max(1, min(n, int(max_width // width)))
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = list(fig.subplots(rows, cols, squeeze=False, **subplots).flat)
    for ax in axes[n:]:
        fig.delaxes(ax)
    return fig, axes[:n]


def figure_row(ncols: int, width: float, height: float):
    """`figure_grid` of ncols panels: one row when it fits the book's column, else stacked."""
    return figure_grid(ncols, width, height)
