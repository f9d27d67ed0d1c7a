"""Small helpers shared by every layer: tensors from array-likes, progress bars, torch thread counts
(chosen by hand or from the CPUs free now), peak memory, and an empty row of matplotlib axes. No science here."""
from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np
import torch

from attnlab.core import settings
from attnlab.core.checks import MAX_LENGTH_LOW, check_int, check_max_length  # noqa: F401 (the library's names)


def kernels_on() -> bool:
    """Whether the numba kernels may run (`normalization.metrics.engine.FUSED` starts from it): ATTNLAB_KERNELS
    unset or not "0"."""
    return settings.get("ATTNLAB_KERNELS")


def as_float64(x, *, dtype=torch.float64, device=None) -> torch.Tensor:
    """Any array-like -> torch tensor of `dtype` on `device` (a tensor keeps its device if None)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(dtype=dtype, device=device if device is not None else x.device)
    return torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=dtype, device=device)


def last_visible(vis: torch.Tensor) -> torch.Tensor:
    """Each row's last visible key + 1 (0 where a row sees none), vis bool [..., K] -> long [...]: the keys past it are
    hidden from the row. The one place for this fact (the metric engine, the capture, the normalizers use it)."""
    K = vis.shape[-1]
    if K == 0:
        return torch.zeros(vis.shape[:-1], dtype=torch.long, device=vis.device)
    last = K - vis.flip(-1).view(torch.uint8).argmax(-1)                 # the first True from the end
    return torch.where(vis.gather(-1, (last - 1).unsqueeze(-1)).squeeze(-1), last, 0)


def atomic_write(path: Path, data: bytes) -> str:
    """Write bytes so that readers never see a half-written file: a unique temporary file in the same
    folder, then `os.replace` (atomic). Two writers never share a temporary file; the last replace wins.
    The file gets the usual permissions (0666 less the umask). Returns the sha256 (hex) of `data`: what
    this call wrote, whatever another writer puts at `path` afterwards."""
    import hashlib

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
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def folder_lock(folder: Path, name: str = ".attnlab.lock"):
    """Context manager: an exclusive advisory lock (flock) on `folder`/`name`, waited for; two runs that
    write one folder take turns instead of interleaving their files. Released on exit or when the process
    dies. A no-op where flock does not exist (Windows)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(Path(folder) / name, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def regular_file(path, what: str, *, limit: Optional[int] = None, error: type = ValueError, fix: str = "") -> Path:
    """`path` (~ expanded, symlinks followed) when it is a regular file of at most `limit` bytes (None: any size),
    checked with os.stat before anything opens it: a FIFO would block the open, a device never ends. Otherwise
    `error` with one line: "<what> '<path>' <what is wrong>[: <fix>]". The one rule for every file attnlab opens."""
    import stat

    p, tail = Path(path).expanduser(), f": {fix}" if fix else ""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(f"{what} {str(path)!r} does not exist{tail}") from None
    except OSError as exc:
        raise error(f"cannot read {what} {str(path)!r} ({exc.strerror or exc}){tail}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {str(path)!r} is a directory{tail}")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {str(path)!r} is not a regular file (a device, FIFO or socket){tail}")
    if limit is not None and st.st_size > limit:
        raise error(f"{what} {str(path)!r} is larger than {_size(limit)}{tail}")
    return p


@contextlib.contextmanager
def open_regular(path, what: str, *, limit: Optional[int] = None, error: type = ValueError, fix: str = ""):
    """Context manager: `path` opened for binary reading once `regular_file` accepts it. The open itself never
    blocks (O_NONBLOCK) and is checked again (fstat), so a file swapped for a FIFO in between is refused too."""
    import stat

    p = regular_file(path, what, limit=limit, error=error, fix=fix)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise error(f"cannot read {what} {str(path)!r} ({exc.strerror or exc})" + (f": {fix}" if fix else "")) from None
    fh = os.fdopen(fd, "rb")
    with fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{what} {str(path)!r} is not a regular file (a device, FIFO or socket)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        yield fh


def read_regular(path, what: str, *, limit: int, error: type = ValueError, fix: str = "") -> bytes:
    """The bytes of `path` by `open_regular`'s rule, at most `limit` of them (a file that grew past it is refused)."""
    with open_regular(path, what, limit=limit, error=error, fix=fix) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise error(f"{what} {str(path)!r} is larger than {_size(limit)}" + (f": {fix}" if fix else ""))
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def check_device(device, option: str = "--device") -> str:
    """`device` when it is "cpu", "cuda" or "cuda:<n>" and, for CUDA, available here; else ValueError in one line.
    The one device check of the CLI and the library (`load_model`, `figures.Inputs`)."""
    import re

    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"{option} must be cpu, cuda or cuda:<n>, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    return device


def writable_dir(path, what: str = "--out") -> Path:
    """`path` as a folder that exists and can be written (created if missing), checked before any work;
    a ValueError says what is wrong and what to do ('' names no folder: refused, never read as '.')."""
    if not str(path).strip():
        raise ValueError(f"{what} {str(path)!r} names no folder: pass a directory, or leave {what} out")
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
    """`iterable` wrapped in a tqdm bar (notebook or terminal) when `show`, else unchanged. In a terminal the bar
    shows only when stderr is one (tqdm's disable=None): a pipe or a log file gets no \\r or cursor codes."""
    if not show:
        return iterable
    from tqdm.auto import tqdm

    in_kernel = "ipykernel" in sys.modules        # a notebook's widget bar: its stream is never a TTY
    return tqdm(iterable, desc=desc, total=total, leave=False, disable=False if in_kernel else None)


class ThreadState:
    """torch's thread bookkeeping of one process, with one owner: the process's is `THREADS`, and the module's
    `threads`, `auto_threads`, `recheck_threads`, `threads_chosen`, `start_numba_pool` are its methods. It holds
    torch's count when it was made (`default`: attnlab's import; a count that still equals it was not chosen by
    the user), the open `threads(n)` contexts (`depth`), of them opened by `auto_threads` (`auto`), and whether
    numba's pool was started (`numba`). A test that needs a fresh one makes its own instead of resetting this one."""

    def __init__(self):
        self.default = torch.get_num_threads()
        self.depth = self.auto = 0
        self.numba = False

    @contextlib.contextmanager
    def threads(self, n: Optional[int]):
        """Context manager: torch intra-op threads = n (an integer from 1 to `allowed_cpus()`; more crashed
        OpenMP: 100000 segfaulted) inside, restored on exit (None: unchanged). On a busy shared CPU one thread
        can be several times faster than two (OpenMP threads wait for each other)."""
        if n is None:
            yield
            return
        n = int(n)
        if not 1 <= n <= allowed_cpus():
            raise ValueError(f"threads must be an integer from 1 to {allowed_cpus()} (the CPUs this process may use), "
                             f"got {n}")
        self.start_numba_pool()
        old = torch.get_num_threads()
        torch.set_num_threads(n)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            torch.set_num_threads(old)

    def start_numba_pool(self) -> None:
        """Start numba's thread pool now (once), keeping torch's thread count.

        numba's "omp" threading layer shares torch's OpenMP runtime and, when its pool starts (at the first
        parallel kernel), sets the OpenMP thread count, torch's included, to NUMBA_NUM_THREADS (all CPUs): a
        count chosen before (threads(n), torch.set_num_threads, OMP_NUM_THREADS) would be lost mid-run."""
        if self.numba:
            return
        self.numba = True
        try:
            import numba
        except ImportError:
            return
        n = torch.get_num_threads()
        numba.get_num_threads()                   # starts the pool
        torch.set_num_threads(n)

    def threads_chosen(self) -> bool:
        """True when the user chose torch's thread count: OMP_NUM_THREADS is set, or the count was changed
        since attnlab was imported (torch.set_num_threads, or inside `threads(n)` / `auto_threads()`)."""
        return (bool(os.environ.get("OMP_NUM_THREADS")) or self.depth > 0
                or torch.get_num_threads() != self.default)

    @contextlib.contextmanager
    def auto_threads(self):
        """Context manager: unless the user chose a thread count (`threads_chosen`), torch threads =
        min(current, free_cpus()) inside. Beside another busy process, two OpenMP threads on two cores
        wait for each other (spinning waits): several times slower than one; on an idle machine nothing
        changes.
        It only ever lowers the count, decides when entered (nested calls keep the outer choice) and again
        at each `recheck_threads()` (between figures and blocks: a neighbour that came or left), and
        torch's count (which numba's kernels follow) is restored on exit. To fix a count: `threads=n`,
        `--threads n` or OMP_NUM_THREADS."""
        if self.threads_chosen():
            yield
            return
        with self.threads(min(torch.get_num_threads(), free_cpus())):
            self.auto += 1
            try:
                yield
            finally:
                self.auto -= 1

    def recheck_threads(self) -> int:
        """Inside `auto_threads()` and no count chosen since: torch threads = min(torch's count at import,
        free_cpus()) again, for the load now: a run that started on a quiet machine and got a busy neighbour
        later kept 2 threads (fig4 at GPT-2 shape 232 s; 92 s with 1 thread). A no-op elsewhere. Returns
        torch's count."""
        if self.auto and self.depth == self.auto and not os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(min(self.default, free_cpus()))
        return torch.get_num_threads()


#: this process's thread bookkeeping (made at attnlab's import: `default` is torch's count then)
THREADS = ThreadState()
threads = THREADS.threads
start_numba_pool = THREADS.start_numba_pool
threads_chosen = THREADS.threads_chosen
auto_threads = THREADS.auto_threads
recheck_threads = THREADS.recheck_threads


def cpu_class() -> str:
    """ATen's CPU capability here ('AVX512', 'AVX2', 'DEFAULT'): machines of one class sum float32 products and
    vector kernels alike, so their last digits agree (the golden probes, tests/test_golden.py, and the book's stored
    outputs, scripts/check_outputs.py, keep a variant per class)."""
    return torch.backends.cpu.get_cpu_capability()


def allowed_cpus() -> int:
    """CPUs this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of the whole machine from the first line of /proc/stat (Linux)."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:9]]   # user nice system idle iowait irq softirq steal
    return fields[3] + fields[4], sum(fields)


#: the last `free_cpus` read: (machine idle jiffies, total jiffies, this process's CPU seconds, monotonic seconds)
_LAST_CPU_READ: list[tuple[float, float, float, float]] = []
#: the oldest last read `free_cpus` measures from instead of sleeping (seconds)
CPU_READ_MAX_AGE = 30.0


def _cpu_read() -> tuple[float, float, float, float]:
    return (*_cpu_times(), time.process_time(), time.monotonic())


def free_cpus(interval: float = 0.1) -> int:
    """How many CPUs are free now, in [1, allowed_cpus()].

    Linux: what the other processes left of the machine since the last call, when that was `interval` to
    CPU_READ_MAX_AGE seconds ago (between a run's figures: no wait), else over `interval` seconds of sleep: the
    machine's idle time (two reads of /proc/stat) plus this process's own CPU time (its threads are not a
    neighbour), in CPUs; a CPU counts when it is at least 80% free. Elsewhere: allowed CPUs minus the 1-minute
    load average. Never below 1."""
    n = allowed_cpus()
    try:
        now = _cpu_read()
        last = _LAST_CPU_READ[-1] if _LAST_CPU_READ else None
        if last is None or not interval <= now[3] - last[3] <= CPU_READ_MAX_AGE:
            last = now
            time.sleep(interval)
            now = _cpu_read()
        _LAST_CPU_READ[:] = [now]
        idle, total, own, wall = (b - a for a, b in zip(last, now))
        free = (os.cpu_count() or n) * idle / max(total, 1) + own / max(wall, 1e-6)
    except (OSError, ValueError, IndexError):
        try:
            free = n - os.getloadavg()[0]
        except (AttributeError, OSError):
            return n
    return max(1, min(n, math.floor(free + 0.2)))


def with_threads(fn: Callable) -> Callable:
    """Decorator: run `fn` under `threads(kwargs["threads"])` (the `threads` protocol option), or under
    `auto_threads()` when that is None (the CPUs free now, unless the user chose a count)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start_numba_pool()                    # before a kernel may reset the count the caller chose
        n = kwargs.get("threads")
        with threads(n) if n is not None else auto_threads():
            return fn(*args, **kwargs)
    return wrapper


def peak_memory_bytes() -> int:
    """Peak resident memory of this process so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def peak_memory_line() -> str:
    """'peak memory: 2.31 GB' (10^9 bytes): the peak resident memory of this process."""
    return f"peak memory: {peak_memory_bytes() / 1e9:.2f} GB"


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


def drop_damaged_numba_cache(folder) -> list[Path]:
    """Delete the numba cache files under `folder` that numba could not read, with one warning; numba then
    compiles those kernels again. Without this, a truncated or garbled index or data file (a full disk, a
    killed write) raises UnpicklingError on every run. Index files (.nbi, small) are read as numba reads
    them; data files (.nbc) must look like whole pickles: the protocol mark first and the STOP opcode last
    (two bytes read); a damaged one, or one that is not a regular file, is dropped with its index. Returns the
    files dropped."""
    import pickle
    import warnings

    bad = set()
    for path in sorted(Path(folder).rglob("*.nb[ic]")) if Path(folder).is_dir() else []:
        try:
            with open_regular(path, "numba cache file", error=OSError) as fh:     # a FIFO there would block open()
                if path.suffix == ".nbi":
                    pickle.load(fh)                           # numba's version stamp, then the index
                    pickle.loads(fh.read())
                else:
                    first = fh.read(1)
                    fh.seek(-1, os.SEEK_END)
                    if first != b"\x80" or fh.read(1) != b".":
                        raise pickle.UnpicklingError("truncated")
        except Exception:  # noqa: BLE001 - any failure to read is damage
            bad.add(path)
            if path.suffix == ".nbc":                         # <module>.<fn>-<line>.py311.<n>.nbc -> ...py311.nbi
                bad.add(path.with_name(path.name.rsplit(".", 2)[0] + ".nbi"))
    dropped = []
    for path in sorted(bad):
        try:
            path.unlink()
            dropped.append(path)
        except OSError:
            pass
    if dropped:
        warnings.warn(f"attnlab: dropped {len(dropped)} damaged numba cache file(s) in {folder}; compiling again",
                      stacklevel=2)
    return dropped


class _UnverifiedNumbaCache(Exception):
    """A numba cache data file without attnlab's checksum beside it (written before attnlab kept one): recompiled
    quietly, never loaded unchecked."""


def tolerate_damaged_numba_cache() -> None:
    """Make a numba cache entry that cannot be trusted a miss: numba then compiles that function again and stores
    it anew. Each data file numba saves gets its sha256 beside it (<file>.sha256); a data file whose bytes differ
    (damaged inside, its first and last bytes kept: `drop_damaged_numba_cache` only sees the ends) or that numba
    cannot unpickle or parse is refused before its machine code is used (unchecked, zeros in the object code
    crash the process), with one warning; one without a checksum is recompiled quietly. Wraps numba's
    `Cache.load_overload` and `IndexDataCacheFile._save_data` / `_load_data`, once per process."""
    import hashlib
    import pickle
    import warnings

    from numba.core import caching

    load = caching.Cache.load_overload
    if getattr(load, "attnlab_tolerant", False):
        return
    save_data = caching.IndexDataCacheFile._save_data

    def checksum_path(self, name) -> Path:
        path = Path(self._data_path(name))
        return path.with_name(path.name + ".sha256")

    def _save_data(self, name, data):
        save_data(self, name, data)
        atomic_write(checksum_path(self, name), hashlib.sha256(Path(self._data_path(name)).read_bytes()).hexdigest()
                     .encode())

    def _load_data(self, name):
        try:
            want = checksum_path(self, name).read_text().strip()
        except OSError:
            raise _UnverifiedNumbaCache(name) from None
        with open_regular(self._data_path(name), "numba cache file", error=OSError) as fh:
            data = fh.read()
        if hashlib.sha256(data).hexdigest() != want:
            raise pickle.UnpicklingError(f"{name}: its sha256 differs from the one saved")
        return pickle.loads(data)                   # as numba's own _load_data

    def load_overload(self, sig, target_context):
        try:
            return load(self, sig, target_context)
        except Exception as exc:  # noqa: BLE001 - any failure to load a cached kernel is damage
            if not isinstance(exc, _UnverifiedNumbaCache):
                where = getattr(getattr(self, "_cache_file", None), "_index_path", None) or "the numba cache"
                first = str(exc).splitlines()[0][:120] if str(exc) else ""
                warnings.warn(f"attnlab: a damaged numba cache file in {where} ({type(exc).__name__}: {first}); "
                              "compiling again", stacklevel=2)
            try:
                self.flush()                        # an empty index: numba compiles and saves this function again
            except OSError:
                pass
            return None

    load_overload.attnlab_tolerant = True
    caching.Cache.load_overload = load_overload
    caching.IndexDataCacheFile._save_data = _save_data
    caching.IndexDataCacheFile._load_data = _load_data
