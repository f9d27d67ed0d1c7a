"""`attnlab info` and `attnlab bench capture`."""
from __future__ import annotations

import platform
import time

import torch


def add_cli(sub) -> None:
    p = sub.add_parser("info", help="versions, models that load (and why not), data directory, corpora")
    p.set_defaults(func=run_info)
    b = sub.add_parser("bench", help="benchmarks that print ratios measured in one run")
    b.add_argument("what", choices=sorted(BENCHES), help="which benchmark")
    b.add_argument("--model", default="minilm")
    b.add_argument("--quick", action="store_true", help="small grids (smoke test)")
    b.set_defaults(func=run_bench)


def _bench_capture_cli(args) -> list[dict]:
    rows = bench_capture(repeats=2 if args.quick else 5)
    for r in rows:
        print(f"{r['model']:10s} L={r['L']:5d}  eager {r['eager_s']*1e3:8.1f} ms  capture {r['capture_s']*1e3:8.1f} ms"
              f"  ratio {r['ratio']:.2f}x (target <= 1.3x)")
    return rows


# name -> "module:function" taking the parsed args, printing its table, returning rows
BENCHES = {
    "capture": "attnlab.cli_info:_bench_capture_cli",
    "figures": "attnlab.cli_figures:bench_figures_cli",
    "normalizers": "attnlab.compare:bench_normalizers_cli",
    "montecarlo": "attnlab.cli_figures:bench_montecarlo_cli",
}


def run_bench(args) -> int:
    import importlib

    module, func = BENCHES[args.what].split(":")
    getattr(importlib.import_module(module), func)(args)
    return 0


def run_info(args) -> int:
    import transformers

    import attnlab
    from attnlab import models, text

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


def bench_capture(model_names=("minilm", "tiny-gpt2"), lengths=None, repeats: int = 5) -> list[dict]:
    """Time a capturing forward pass (all layers, probs+scores+q/k/v) against a plain eager pass, same ids."""
    from attnlab.models import load_model

    lengths = lengths or {"minilm": 512, "tiny-gpt2": 1024}
    rows = []
    for name in model_names:
        model = load_model(name)
        L = lengths[name]
        ids = torch.randint(1000, 2000, (L,))

        def eager():
            with model.implementation("eager"), torch.no_grad():
                model.hf(input_ids=ids[None])

        def capture():
            model.capture(ids, keep=("probs", "scores", "q", "k", "v"))

        timings = {}
        for label, fn in (("eager", eager), ("capture", capture)):
            fn()  # warm-up
        for _ in range(repeats):  # interleave so load changes hit both
            for label, fn in (("eager", eager), ("capture", capture)):
                t0 = time.perf_counter()
                fn()
                timings.setdefault(label, []).append(time.perf_counter() - t0)
        best = {k: min(v) for k, v in timings.items()}
        rows.append({"model": name, "L": L, "eager_s": best["eager"], "capture_s": best["capture"],
                     "ratio": best["capture"] / best["eager"]})
    return rows
