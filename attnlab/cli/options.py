"""Options shared by the subcommands."""
from __future__ import annotations

import argparse


def model_args(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    """--model and --device."""
    parser.add_argument("--model", default=default,
                        help="auto (GPT-2 if available, else SmolLM2, else MiniLM), gpt2, minilm, smollm2 "
                        "(SmolLM2-135M-Instruct, causal, 4-bit weights), tiny-gpt2, gpt2-random (GPT-2 124M shape, "
                        "random weights: benchmarks only), a hub id, a local dir, or a .gguf file (or a dir holding "
                        "one)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
