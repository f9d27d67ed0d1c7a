"""The checks of counts the CLI and the library take, in a module that imports no torch or numpy (argparse's `type=`
uses them while `attnlab --help` stays fast)."""
from __future__ import annotations

import numbers
from typing import Optional


def _is_bool(value) -> bool:
    """A Python or numpy bool (never read as 0 or 1)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def check_int(value, option: str, *, low: int) -> int:
    """`value` as an int >= `low` (an int, or text that spells one: "12"); else ValueError in one line naming
    `option`. A bool, a float with a fraction, NaN and "" are refused, never read as a default. The one check for
    every count the CLI and the library take (--max-length, --threads, --n-top, ...)."""
    n = None
    if not _is_bool(value):
        if isinstance(value, numbers.Integral):                       # int, numpy integers
            n = int(value)
        elif isinstance(value, numbers.Real) and float(value).is_integer():
            n = int(value)
        elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            n = int(value.strip())
    if n is None or n < low:
        raise ValueError(f"{option} must be an integer >= {low}, got {value!r}")
    return n


# the shortest --max-length each use takes: "figures" the longest window of the paper-1 figures (`figures.Inputs`,
# `attnlab figures`, `attnlab check --windows`): at least their length grid's first L, 32; "bench" where
# `attnlab bench figures` cuts the window (`benchmarks.bench_figures`): any L >= 2
MAX_LENGTH_LOW = {"figures": 32, "bench": 2}


def check_max_length(value, use: str, option: str = "--max-length") -> Optional[int]:
    """None, or `value` as an int >= MAX_LENGTH_LOW[use] (`check_int`): the one check of --max-length (argparse's
    `type=` through `cli.options.arg_type`, the library's max_length arguments)."""
    return None if value is None else check_int(value, option, low=MAX_LENGTH_LOW[use])
