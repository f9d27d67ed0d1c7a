"""`attnlab info`: versions, which models load (and why not), the data directory, corpora + sha256."""
from __future__ import annotations

import platform

import torch


def add_cli(sub) -> None:
    p = sub.add_parser("info", help="versions, models that load (and why not), data directory, corpora")
    p.set_defaults(func=run_info)


def run_info(args) -> int:
    import transformers

    import attnlab
    from attnlab.core import models, text

    print(f"python        {platform.python_version()}")
    print(f"torch         {torch.__version__} (cuda available: {torch.cuda.is_available()})")
    print(f"transformers  {transformers.__version__}")
    print(f"attnlab       {attnlab.__version__}")
    print(f"data dir      {text.data_dir() or '(not set: ' + text.DATA_ENV + ')'}")
    print(f"cache dir     {text.cache_dir()}")
    print(f"hub reachable {models.hub_reachable()}")
    print("models:")
    for name in ("gpt2", "minilm", "tiny-gpt2"):
        try:
            m = models.load_model(name)
            sha = f", safetensors sha256 {m.weights_sha256} (verified)" if name == "minilm" else (
                f", sha256 {m.weights_sha256}" if m.weights_sha256 else "")
            print(f"  {name:10s} ok: {m.n_layers}x{m.n_heads} heads, {m.max_positions} positions, {m.source}{sha}")
        except Exception as exc:  # noqa: BLE001 - report every failure, keep going
            print(f"  {name:10s} unavailable: {exc}")
    print("corpora:")
    for name in text.CORPORA:
        try:
            c = text.load_corpus(name, allow_download=False)
            print(f"  {name:14s} {c.source}  sha256 {c.sha256} ({'verified' if c.verified else 'unknown file'})")
        except Exception as exc:  # noqa: BLE001
            print(f"  {name:14s} unavailable: {exc}")
    return 0
