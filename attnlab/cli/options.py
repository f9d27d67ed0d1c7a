"""Options shared by the subcommands."""
from __future__ import annotations

import argparse

from attnlab.core import model_table


def model_args(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    """--model and --device."""
    parser.add_argument("--model", default=default,
                        help=model_table.model_help())
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
