"""Command line: attnlab info | figures | check | capture | bench | diagnose | verify-results | results.

Argument parsing and printing only: each subcommand module (`figures`, `info`, `bench`, `diagnose`, `capture`)
adds its parser with `add_cli(subparsers)` and calls the library. This file only dispatches. Building the parser
imports no torch, numpy or numba (`attnlab --help` answers in a fraction of a second): each command imports what it
needs when it runs.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import warnings


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line, as every other error of the CLI ("attnlab figures: error: ...",
    exit 2), without the usage block before it (`attnlab <command> -h` shows that)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser (light: the subcommands import torch and the rest when they run), inside `main`'s Ctrl-C handling."""
    from attnlab import __version__
    from attnlab.cli import bench, capture, diagnose, figures, info, results, verify

    parser = OneLineParser(
        prog="attnlab", description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="the same from Python: attnlab.figures (the figure registry and claim rows), attnlab.normalization\n"
        "(arXiv 2508.17821), attnlab.sample_complexity (arXiv 2512.10656), attnlab.tools (normalizers, compare,\n"
        "diagnose, report), attnlab.benchmarks, attnlab.core (text, models, capture, result, cache)")
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (info, figures, capture, diagnose, bench, verify, results):
        module.add_cli(sub)
    return parser


#: what the commands import when they run (torch, numpy, numba, transformers, scipy underneath): imported once the
#: arguments are parsed, inside `interrupts_held` (a Ctrl-C while a library imports would leave it half-initialised);
#: --help and --version never get here
COMMAND_IMPORTS = ("attnlab.figures", "attnlab.benchmarks", "attnlab.tools.diagnose", "attnlab.tools.report")


def import_libraries(modules=COMMAND_IMPORTS) -> None:
    """Import `modules` (inside `main`'s Ctrl-C handling)."""
    import importlib

    for name in modules:
        importlib.import_module(name)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (M_MMAP_THRESHOLD 32 MiB, its maximum, and
    M_TRIM_THRESHOLD 1 GiB) instead of handing it back to the OS after every tensor: a figure run
    allocates gigabytes in short-lived multi-MiB tensors, and each fresh page costs a page fault
    (on the project's VMs 30-40% of the metrics' time). A no-op (False) without glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))


def error_line(exc: BaseException) -> str:
    """One line for an error: an OSError as 'path: what' (a full disk, a read-only or misplaced folder, a
    name too long), anything else as its message."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def one_line_warnings(shown=None):
    """A `warnings.showwarning` that prints every warning as one line: attnlab's own (`core.model_files.AttnlabWarning`,
    or raised from attnlab's code) as "attnlab: warning: ...", a library's as "attnlab: warning: (Category from
    module) ...". `shown` (Python's) is kept for the signature's sake: no warning needs its two lines."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def show(message, category, filename, lineno, file=None, line=None):
        from attnlab.core.model_files import AttnlabWarning

        text = " ".join(str(message).split())
        text = text[len("attnlab: "):] if text.startswith("attnlab: ") else text
        ours = issubclass(category, AttnlabWarning) or os.path.abspath(str(filename)).startswith(package)
        if not ours:
            where = os.path.splitext(os.path.basename(str(filename)))[0]
            text = f"({category.__name__} from {where}) {text}"
        print(f"attnlab: warning: {text}", file=file or sys.stderr)
    return show


def _stop_once(signum, frame):
    """Ctrl-C: ignore every later press from now on, then stop. A second press while the first unwinds (a
    progress bar closing, a generator finalised) would otherwise print an 'Exception ignored' traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_held():
    """Hold a Ctrl-C pressed inside the block (the imports of torch, numpy, numba...) and raise it as
    KeyboardInterrupt when the block ends: an import that a library interrupted and swallowed would leave a
    half-initialised module behind (numpy without `logical_or`: an AttributeError or a RecursionError later).
    After the block a press stops at once and later presses are ignored (`_stop_once`). Does nothing where
    Ctrl-C is neither the default handler nor `_stop_once` (ignored, or a caller's own)."""
    if signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, _stop_once):   # _stop_once: an earlier
        yield                                                                              # block's
        return
    pressed = []
    signal.signal(signal.SIGINT, lambda *_: pressed.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN if pressed else _stop_once)
    if pressed:
        raise KeyboardInterrupt


@contextlib.contextmanager
def quiet_stderr(quiet: bool):
    """--quiet: stderr keeps only error, warning and interrupted lines (`options.QuietStderr`) inside the block."""
    if not quiet:
        yield
        return
    from attnlab.cli.options import QuietStderr

    with contextlib.redirect_stderr(QuietStderr(sys.stderr)):
        yield


def main(argv=None) -> int:
    """Run one subcommand. Exit 0 done, 1 (check --strict) a claim fails, 2 one error line, 130 Ctrl-C:
    one line whenever it is pressed (while importing, or twice: the second press is ignored)."""
    name = "attnlab"                                        # + the subcommand, once parsed
    handler = signal.getsignal(signal.SIGINT)               # restored on return (main called in-process)
    shown = warnings.showwarning                            # as well
    try:
        with interrupts_held():
            from attnlab.core.style import use_figure_style

            parser = build_parser()
        args = parser.parse_args(argv)
        name = f"attnlab {args.command}"
        if not sys.stderr.isatty():          # every tqdm bar off in a pipe, those made without disable=None too:
            os.environ.setdefault("TQDM_DISABLE", "1")   # tqdm reads TQDM_* once, when it is first imported
        with interrupts_held():
            import_libraries()
        warnings.simplefilter("default")
        warnings.showwarning = one_line_warnings(shown)
        keep_freed_memory()
        use_figure_style()
        with quiet_stderr(getattr(args, "quiet", False)):
            return int(args.func(args) or 0)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"{name}: error: {error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        handler = signal.SIG_IGN                            # a second Ctrl-C while stopping: no traceback
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, handler)
        warnings.showwarning = shown
