"""Options shared by the subcommands, and `--quiet`'s filter of stderr."""
from __future__ import annotations

import argparse
import functools
import io
from typing import Callable

from attnlab.core import model_table
from attnlab.core.checks import check_max_length


def model_args(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    """--model and --device."""
    parser.add_argument("--model", default=default,
                        help=model_table.model_help())
    parser.add_argument("--device", default="cpu", help="cpu or cuda")


def arg_type(check: Callable, option: str) -> Callable[[str], object]:
    """argparse's `type=` for `option` from a library check check(text) that raises ValueError "<option> must ...":
    a bad value then gives argparse's one line "argument <option>: must ...", exit 2."""
    def parse(text: str):
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{option} ")) from None
    return parse


def max_length_type(use: str) -> Callable[[str], object]:
    """argparse's `type=` for --max-length in `use` (a key of `util.MAX_LENGTH_LOW`: its bound)."""
    return arg_type(functools.partial(check_max_length, use=use), "--max-length")


def quiet_arg(parser: argparse.ArgumentParser) -> None:
    """--quiet: every command takes it."""
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bars or progress lines on stderr: only results, warnings and errors")


class QuietStderr(io.TextIOBase):
    """stderr under --quiet: passes the lines "attnlab...: error: ...", "attnlab: warning: ..." and "... interrupted"
    whole, drops every other line (progress, "computed ..." lines); never a TTY, so progress bars stay off."""

    def __init__(self, stream):
        self.stream, self.pending = stream, ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.replace("\r", "\n").split("\n")     # a bar's \r ends a line too
        for line in lines:
            if line.startswith("attnlab") and (": error: " in line or ": warning: " in line
                                               or line.endswith(": interrupted")):
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
