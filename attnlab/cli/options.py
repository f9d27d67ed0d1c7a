"""Options shared by the subcommands."""
from __future__ import annotations

import argparse
import functools
from typing import Callable

from attnlab.core import model_table
from attnlab.core.util import check_max_length


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
