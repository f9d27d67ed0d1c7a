"""`attnlab bench capture|figures|normalizers|montecarlo`: run a benchmark of `attnlab.benchmarks`, print
its table (ratios measured in one run)."""
from __future__ import annotations

from attnlab import benchmarks
from attnlab.figures import Inputs


def _row_line(r: dict) -> str:
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())


def bench_capture(args) -> list[dict]:
    names = (args.model,) if args.model else ("minilm", "tiny-gpt2")
    rows = benchmarks.bench_capture(names, repeats=2 if args.quick else 5)
    for r in rows:
        print(f"{r['model']:10s} L={r['L']:5d}  eager {r['eager_s']*1e3:8.1f} ms  capture {r['capture_s']*1e3:8.1f} ms"
              f"  ratio {r['ratio']:.2f}x (target <= 1.3x)")
    return rows


def bench_figures(args) -> list[dict]:
    """Each paper-1 figure: vectorised vs the per-row oracle on the same traces; last line min speedup."""
    inputs = Inputs(args.model or "minilm", "cpu")
    rows = benchmarks.bench_figures(inputs.model, inputs.ids(), quick=args.quick, progress=False)
    for r in rows:
        print(_row_line(r))
    total = sum(r.get("vectorised_full_s", 0.0) for r in rows)
    print(f"total vectorised time, all figures, all layers: {total:.1f} s ({inputs.model.name})")
    print(f"min speedup: {min(r['speedup'] for r in rows):.1f}")
    return rows


def bench_montecarlo(args) -> list[dict]:
    result = benchmarks.bench_monte_carlo(repeats=2 if args.quick else 3)
    for r in result.rows:
        print(_row_line(r))
    return result.rows


def bench_normalizers(args) -> list[dict]:
    """The timing table and the fastest exact method per case."""
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
    return res.rows


BENCHES = {"capture": bench_capture, "figures": bench_figures, "normalizers": bench_normalizers,
           "montecarlo": bench_montecarlo}


def add_cli(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks that print ratios measured in one run")
    b.add_argument("what", choices=sorted(BENCHES), help="which benchmark")
    b.add_argument("--model", default=None, help="the model (default: minilm, and tiny-gpt2 for capture)")
    b.add_argument("--quick", action="store_true", help="small grids (smoke test)")
    b.set_defaults(func=run_bench)


def run_bench(args) -> int:
    BENCHES[args.what](args)
    return 0
