"""`attnlab bench capture|figures|normalizers|montecarlo`: run a benchmark of `attnlab.benchmarks`, print
its table (ratios measured in one run), the threads it ran with and the process's peak memory."""
from __future__ import annotations

from attnlab.cli.options import max_length_type, quiet_arg
from attnlab.core.checks import MAX_LENGTH_LOW


def _row_line(r: dict) -> str:
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())


def bench_capture(args) -> list[dict]:
    from attnlab import benchmarks
    from attnlab.core.util import peak_memory_line

    names = (args.model,) if args.model else ("minilm", "tiny-gpt2")
    rows = benchmarks.bench_capture(names, repeats=2 if args.quick else 5)
    for r in rows:
        print(f"{r['model']:10s} L={r['L']:5d}  eager {r['eager_s']*1e3:8.1f} ms  capture {r['capture_s']*1e3:8.1f} ms"
              f"  ratio {r['ratio']:.2f}x (target <= 1.3x)")
    print(peak_memory_line())
    return rows


def bench_figures(args) -> list[dict]:
    """Each paper-1 figure: vectorised vs the per-row oracle on the same traces; last line min speedup.
    --no-oracle: the vectorised time on all layers only; last line the total."""
    from attnlab import benchmarks
    from attnlab.core.util import peak_memory_line
    from attnlab.figures import Inputs

    max_length = getattr(args, "max_length", None)
    names = benchmarks.check_bench_figures(getattr(args, "figures", None), max_length)   # before loading a model
    no_oracle = bool(getattr(args, "no_oracle", False))
    inputs = Inputs(args.model or "minilm", getattr(args, "device", "cpu"))
    rows = benchmarks.bench_figures(inputs.model, inputs.ids(), quick=args.quick, progress=False, figures=names,
                                    max_length=max_length, with_oracle=not no_oracle)
    for r in rows:
        print(_row_line(r))
    total = sum(r.get("vectorised_full_s", 0.0) for r in rows)
    if no_oracle:
        print(peak_memory_line())
        print(f"total: {total:.1f} s (vectorised, {len(rows)} figure(s), all layers, {inputs.model.name})")
        return rows
    print(f"total vectorised time, all figures, all layers: {total:.1f} s ({inputs.model.name})")
    print(peak_memory_line())
    print(f"min speedup: {min(r['speedup'] for r in rows):.1f}")
    return rows


def bench_montecarlo(args) -> list[dict]:
    from attnlab import benchmarks
    from attnlab.core.util import peak_memory_line

    result = benchmarks.bench_monte_carlo(repeats=2 if args.quick else 3, device=getattr(args, "device", "cpu"))
    for r in result.rows:
        print(_row_line(r))
    print(peak_memory_line())
    return result.rows


def bench_normalizers(args) -> list[dict]:
    """The timing table and the fastest exact method per case."""
    from attnlab import benchmarks
    from attnlab.core.util import peak_memory_line

    res = benchmarks.bench_normalizers(args.model or "minilm", quick=bool(args.quick))
    print(f"{'case':9s} {'L':>5s} {'alpha':>5s} {'method':13s} {'ms':>9s} {'x softmax':>10s} {'x sort':>7s} "
          f"{'max|diff|':>9s} {'support':>7s}")
    for r in res.rows:
        a = "" if r["alpha"] is None else f"{r['alpha']:g}"
        rs = "" if r["ratio_sort"] is None else f"{r['ratio_sort']:.2f}"
        d = "" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.1e}"
        print(f"{r['case']:9s} {r['L']:5d} {a:>5s} {r['method']:13s} {r['seconds'] * 1e3:9.1f} "
              f"{r['ratio_softmax']:10.1f} {rs:>7s} {d:>9s} {r['support_median']:7.0f}")
    print("fastest exact method:")
    for r in benchmarks.recommend(res):
        print(f"  {r['case']:9s} L={r['L']:5d} alpha={r['alpha']:g}: {r['best']:8s} "
              f"({r['speedup_vs_sort']:.1f}x faster than sort; median support {r['support_median']:.0f})")
    print(f"({res.provenance['torch_threads']} torch threads, {res.provenance['runtime_seconds']:.0f} s; "
          f"{res.provenance['model']})")
    print(peak_memory_line())
    return res.rows


BENCHES = {"capture": bench_capture, "figures": bench_figures, "normalizers": bench_normalizers,
           "montecarlo": bench_montecarlo}


def _int_at_least(value, low: int, option: str):
    """None, or `value` as an int >= low; else ValueError in one line."""
    from attnlab.core.util import check_int

    return None if value is None else check_int(value, option, low=low)


def add_cli(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks that print ratios measured in one run")
    b.add_argument("what", choices=sorted(BENCHES), help="which benchmark")
    b.add_argument("--model", default=None, help="the model (default: minilm, and tiny-gpt2 for capture); "
                   "gpt2-random: GPT-2 124M's shape with random weights, offline")
    b.add_argument("--quick", action="store_true", help="small grids (smoke test)")
    b.add_argument("--device", default="cpu", help="cpu or cuda (bench figures and montecarlo)")
    b.add_argument("--threads", default=None, metavar="N",
                   help="torch threads (default: the CPUs free now, at most torch's count; or set OMP_NUM_THREADS)")
    f = b.add_argument_group("bench figures")
    f.add_argument("--figures", nargs="+", default=None, metavar="ID",
                   help="figure ids to time (default: fig1 fig2a fig2b fig2c fig3 fig4)")
    f.add_argument("--max-length", type=max_length_type("bench"), default=None, metavar="L",
                   help="cap the lengths grid at L tokens (the window's first L tokens; "
                        f"L >= {MAX_LENGTH_LOW['bench']})")
    f.add_argument("--no-oracle", action="store_true",
                   help="skip the per-row oracle (far too slow at GPT-2's shape): vectorised times and a total only")
    quiet_arg(b)
    b.set_defaults(func=run_bench)


def run_bench(args) -> int:
    import torch

    from attnlab import benchmarks
    from attnlab.core.util import allowed_cpus, auto_threads, check_device, threads, threads_chosen

    only_figures = [o for o, v in (("--figures", getattr(args, "figures", None)),
                                   ("--max-length", getattr(args, "max_length", None)),
                                   ("--no-oracle", getattr(args, "no_oracle", False))) if v]
    if getattr(args, "device", "cpu") != "cpu" and args.what not in ("figures", "montecarlo"):
        raise ValueError("--device: for `attnlab bench figures` and `attnlab bench montecarlo` only")
    check_device(getattr(args, "device", "cpu"))
    if args.model is not None and not args.model.strip():          # '' is an error, not the default model
        raise ValueError("--model '' names no model: pass a name as --model takes, or leave --model out")
    if only_figures and args.what != "figures":
        raise ValueError(f"{', '.join(only_figures)}: for `attnlab bench figures` only")
    if args.what == "figures":                     # before any model is loaded or anything printed
        benchmarks.check_bench_figures(getattr(args, "figures", None), getattr(args, "max_length", None))
    n = _int_at_least(getattr(args, "threads", None), 1, "--threads")
    chosen = n is not None or threads_chosen()
    with threads(n) if n is not None else auto_threads():
        how = "chosen" if chosen else f"auto: CPUs free now, of {allowed_cpus()}"
        print(f"torch threads: {torch.get_num_threads()} ({how})")
        BENCHES[args.what](args)
    return 0
