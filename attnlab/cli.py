"""Command line: attnlab info | figures | check | bench | diagnose.

Each subcommand lives beside the science it drives: a module listed in SUBCOMMAND_MODULES provides
`add_cli(subparsers)` and sets `func` on its parser. This file only dispatches.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings

SUBCOMMAND_MODULES = ["attnlab.cli_info", "attnlab.cli_figures", "attnlab.diagnose"]


def model_args(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    """--model and --device, shared by the subcommands."""
    parser.add_argument("--model", default=default,
                        help="auto (GPT-2 if available, else MiniLM), gpt2, minilm, tiny-gpt2, a hub id or a local dir")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            if exc.name != name:
                raise
            continue
        module.add_cli(sub)
    return parser


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


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    warnings.simplefilter("default")
    keep_freed_memory()
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"attnlab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
