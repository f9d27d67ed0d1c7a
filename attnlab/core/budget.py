"""How many torch operator calls and device-to-host transfers a computation makes (`count_calls`), and an opt-in
check that a block of GPU code never waits on the device (`sync_free`). The tests pin the counts of each paper-1
figure on the torch path (the path a GPU runs), so that a per-step loop creeping back fails on this CPU."""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.core import settings

# Tensor methods that bring values to the host (on a GPU, each waits for the device): counted as transfers
_TO_HOST = {torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__float__,
            torch.Tensor.__int__, torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.__array__}
_SCALAR = {"aten::_local_scalar_dense", "aten::nonzero", "aten::equal"}      # operators that wait for the device


class _Transfers(TorchFunctionMode):
    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _TO_HOST or (func is torch.Tensor.to and _to_cpu(args, kwargs)):
            self.counts["transfers"] += 1
        return func(*args, **kwargs)


def _to_cpu(args, kwargs) -> bool:
    dev = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(dev, (str, torch.device)) and torch.device(dev).type == "cpu"


class _Ops(TorchDispatchMode):
    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts["ops"] += 1
        if func.name().split(".")[0] in {s.split("::")[1] for s in _SCALAR}:
            self.counts["scalar_ops"] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_calls() -> Iterator[Counter]:
    """Counter of what the block does: "ops" (ATen operator calls, each a kernel launch on a GPU), "transfers"
    (`.cpu()`, `.item()`, `.tolist()`, `.numpy()`, `float(t)`, `bool(t)`, ..., `.to("cpu")` calls: each a
    device-to-host copy and wait on a GPU) and "scalar_ops" (operators that read values on the host:
    `_local_scalar_dense`, `nonzero`, `equal`)."""
    counts: Counter = Counter()
    with _Transfers(counts), _Ops(counts):
        yield counts


def sync_debug() -> bool:
    """ATTNLAB_SYNC_DEBUG=1: `sync_free` blocks raise on any host sync (CUDA only)."""
    return settings.get("ATTNLAB_SYNC_DEBUG")


@contextlib.contextmanager
def sync_free(t: torch.Tensor) -> Iterator[None]:
    """A block of tensor programs on t's device that must not wait on it: with ATTNLAB_SYNC_DEBUG=1 and t on a CUDA
    device, any synchronising call inside raises (`torch.cuda.set_sync_debug_mode("error")`); else nothing."""
    if not (sync_debug() and t.is_cuda):
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)
