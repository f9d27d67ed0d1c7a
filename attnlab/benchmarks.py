"""Benchmarks that print ratios measured in one run (`attnlab bench ...`): each paper-1 figure against
the per-row oracle on the same traces, the capturing forward pass against a plain one, the
vectorised Monte Carlo against a per-replicate loop, and exact sparse normalizers against each
other. The only module besides the tests that imports the oracle."""
from __future__ import annotations

import math
import time
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.models import as_attn_model, load_model
from attnlab.core.result import Result, provenance
from attnlab.core.text import resolve_text
from attnlab.core.util import check_max_length, with_threads
from attnlab.core.util import progress as progress_bar
from attnlab.figures import FIGURES
from attnlab.normalization import experiments as ex
from attnlab.normalization import oracle
from attnlab.sample_complexity import protocol as sce
from attnlab.sample_complexity.montecarlo import derive_seed, make_generator, replicate_batch
from attnlab.sample_complexity.theory import MAX_SCORES, check_positive_int, self_attention_moments
from attnlab.tools import normalizers
from attnlab.tools.diagnose import text_window

# ------------------------------------------------------------------------------ paper-1 figures

MIN_TIMED_S = 1.0      # bench_figures: a timing that takes less is repeated (at most MAX_REPEATS runs in all)
MAX_REPEATS = 25


def _subset(trace, n_layers: int):
    """The first n_layers layers of a trace (all heads)."""
    from dataclasses import replace

    cut = {}
    for name in ("q", "k", "v", "scores", "probs", "hidden"):
        t = getattr(trace, name)
        cut[name] = None if t is None else t[:n_layers]
    return replace(trace, layers=trace.layers[:n_layers], **cut)


class _Fixed(ex.Captures):
    """Captures over already made traces (bench: same inputs for both implementations)."""

    def __init__(self, source: ex.Captures, n_layers: Optional[int] = None):
        self.model, self.ids, self.keep = source.model, source.ids, source.keep
        self.n_passes, self.seconds = 0, 0.0
        self._src, self._n_layers = source, n_layers
        self.traces, self.last = {}, None

    def get(self, L: int):
        t = self._src.get(L)
        self.last = t if self._n_layers is None else _subset(t, self._n_layers)
        return self.last


def check_bench_figures(figures: Optional[Sequence[str]] = None, max_length: Optional[int] = None) -> list[str]:
    """The figure ids `bench_figures` will time (default: every paper-1 figure of the registry), checked
    with `max_length` (`util.check_max_length`: None or an integer >= 2) before any model is loaded; ValueError in one
    line."""
    known = [i for i in FIGURES if i in ex.FIGURE_FUNCS]          # the paper's figures (the oracle covers them)
    names = list(dict.fromkeys(figures)) if figures else known
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure id(s) {', '.join(map(str, unknown))}; bench figures times {', '.join(known)}")
    other = [n for n in names if n not in known]
    if other:
        raise ValueError(f"{', '.join(other)}: bench figures times the paper's figures only ({', '.join(known)})")
    check_max_length(max_length, "bench", "max_length")
    return names


@with_threads
def bench_figures(model, ids, quick: bool = True, *, oracle_layers: Optional[int] = None,
                  figures: Optional[Sequence[str]] = None, progress: bool = False, repeats: int = 3,
                  max_length: Optional[int] = None, with_oracle: bool = True, **protocol) -> list[dict]:
    """Time each figure, vectorised vs the per-row oracle, on the same captured traces.

    The forward passes are made once, before timing. The oracle runs on the first `oracle_layers`
    layers (default: all when quick, 1 otherwise: the oracle is linear in the number of heads), and
    the vectorised code is timed on the same subset (`speedup`, like for like; the median of at least
    `repeats` runs, after a first run on all layers that also warms up) and on all layers. A timing
    shorter than MIN_TIMED_S in all (the oracle's too) is repeated until it fills it (`repeats`,
    `oracle_repeats`: the counts), so a 10 ms figure is not one scheduler hiccup away from half its ratio.
    `oracle_full_s_est` extrapolates the oracle linearly to all layers. One dict per figure.

    figures: ids of paper-1 figures (default all); max_length: cut the window to its first
    `max_length` tokens, so the length grid (32, 64, ... up to the window) stops there; with_oracle=False:
    only the one run on all layers (`vectorised_full_s`; the per-row oracle takes hours at GPT-2's shape).
    """
    names = check_bench_figures(figures, max_length)
    p = ex.resolve_protocol(quick, protocol)
    keep = set().union(*(ex.trace_needs(n, p) for n in names))
    window = ex.as_windows(ids)[0]
    cap = ex.Captures(model, window if max_length is None else window[:max_length], keep)
    grid = ex.length_grid(model, len(cap.ids), quick, p["lengths"])
    for L in (grid if not model.causal else grid[-1:]):
        cap.get(L)
    n_layers = len(cap.get(grid[-1]).layers)
    sub = n_layers if (oracle_layers is None and quick) else min(n_layers, oracle_layers or 1)
    plan = [("vectorised_full", None, "vectorised", 1)]
    if with_oracle:
        plan += [("vectorised", sub, "vectorised", max(1, repeats)), ("oracle", sub, "oracle", 1)]
    rows, res = [], None
    for name in names:
        func = FIGURES[name].compute
        proto = {k: v for k, v in protocol.items() if k != "impl"}
        timings, counts = {}, {}
        for label, layers, impl, n in plan:
            run = dict(proto)
            if impl == "oracle" and name == "fig2c":
                # the oracle scans exactly as far as the vectorised run on the same inputs did
                run["n_max"] = max(r["N"] for r in res.rows)
            times = []
            # at least n runs; short ones repeat until they fill MIN_TIMED_S (the median steadies)
            while len(times) < n or (label != "vectorised_full" and sum(times) < MIN_TIMED_S
                                     and len(times) < MAX_REPEATS):
                t0 = time.perf_counter()
                res = func(
                    model,
                    None,
                    quick=quick,
                    progress=progress,
                    captures=[_Fixed(cap, layers)],
                    impl=(oracle if impl == "oracle" else impl),
                    **run,
                )
                times.append(time.perf_counter() - t0)
            timings[label] = float(np.median(times))
            counts[label] = len(times)
        row = {"figure": name, "model": model.name, "quick": quick, "L_max": grid[-1], "n_lengths": len(grid),
               "layers_total": n_layers, "vectorised_full_s": round(timings["vectorised_full"], 4)}
        if with_oracle:
            row.update({
                "oracle_layers": sub,
                "vectorised_s": round(timings["vectorised"], 4),
                "oracle_s": round(timings["oracle"], 4),
                "speedup": round(timings["oracle"] / max(timings["vectorised"], 1e-9), 2),
                "oracle_full_s_est": round(timings["oracle"] * n_layers / sub, 2),
                "speedup_full_est": round(
                    timings["oracle"] * n_layers / sub / max(timings["vectorised_full"], 1e-9), 2
                ),
                "repeats": counts["vectorised"], "oracle_repeats": counts["oracle"],
            })
        row.update({"capture_s": round(cap.seconds, 3), "torch_threads": torch.get_num_threads()})
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ capture


def bench_capture(model_names=("minilm", "tiny-gpt2"), lengths=None, repeats: int = 5) -> list[dict]:
    """Time a capturing forward pass (all layers, probs+scores+q/k/v) against a plain eager pass, same ids,
    at L = `lengths[name]` or the model's positions (at most 1024)."""
    lengths = lengths or {}
    rows = []
    for name in model_names:
        model = load_model(name)
        L = lengths.get(name, min(int(model.max_positions), 1024))
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
        rows.append(
            {
                "model": name,
                "L": L,
                "eager_s": best["eager"],
                "capture_s": best["capture"],
                "ratio": best["capture"] / best["eager"],
            }
        )
    return rows


# ------------------------------------------------------------------------------ Monte Carlo


def _best_time(fn, repeats: int, device: str):
    """(best wall-clock seconds over `repeats` calls of fn(), the last call's result); CUDA synchronised."""
    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    best, out = float("inf"), None
    for _ in range(max(1, repeats)):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best, out


def _monte_carlo_rows(X: torch.Tensor, A: torch.Tensor, V: torch.Tensor, b: int, repeats: int, max_scores: int,
                      device: str) -> list[dict]:
    """The two timing rows (vectorised in batches of b replicates, per-replicate loop) of token sets X [k, n, d]."""
    k, n, d = X.shape

    def vectorised():
        parts = [self_attention_moments(X[s : s + b], A, V, max_scores=max_scores) for s in range(0, k, b)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def loop():
        out = [self_attention_moments(X[i], A, V, max_scores=max_scores) for i in range(k)]
        return torch.stack([o[0] for o in out]), torch.stack([o[1] for o in out])

    times, results = {}, {}
    for name, fn in (("vectorised", vectorised), ("loop", loop)):
        times[name], results[name] = _best_time(fn, repeats, device)
    diff = max(float((results["vectorised"][j] - results["loop"][j]).abs().max()) for j in (0, 1))
    return [{"method": name, "n": n, "k": k, "d": d, "batch": b if name == "vectorised" else 1,
             "seconds": times[name], "per_replicate_ms": 1e3 * times[name] / k,
             "speedup": times["loop"] / times[name], "max_abs_diff": diff, "device": device}
            for name in ("vectorised", "loop")]


def bench_monte_carlo(
    *,
    n_values: Sequence[int] = (64, 256, 1024),
    k: int = 32,
    d: int = 50,
    scale: float = 10.0,
    rho: float = 0.1,
    repeats: int = 3,
    seed: int = 0,
    device: str = "cpu",
    dtype="float32",
    max_scores: int = MAX_SCORES,
) -> Result:
    """Timing rows: the same k pre-drawn token sets ``[k, n, d]`` (Gaussian setting of
    :func:`moment_convergence`), their self-attention moments computed (a) vectorised over
    replicates in batches of :func:`replicate_batch` and (b) by a plain python loop, one
    replicate at a time.  Best of ``repeats`` wall-clock times; ``speedup = loop / vectorised``
    measured in the same run; ``max_abs_diff`` checks both give the same moments."""
    device, dt = sce.check_device(device), sce.as_dtype(dtype)
    k = check_positive_int(k, "k")
    Wq, Wk, Wv = sce.random_weights(d, seed, 1.0 / math.sqrt(d))
    A = (scale * Wk.T @ Wq / math.sqrt(d)).to(device, dt)
    V = Wv.to(device, dt)

    rows = []
    for n in sce.grid_values(n_values, "n", integer=True):
        X = math.sqrt(rho) * torch.randn(
            k, n, d, generator=make_generator(derive_seed(seed, n), device), dtype=dt, device=device
        )
        rows += _monte_carlo_rows(X, A, V, replicate_batch(n, k, max_scores, device), repeats, max_scores, device)
    prov = provenance(
        experiment="bench_monte_carlo",
        paper=sce.PAPER,
        n_values=list(n_values),
        k=k,
        d=d,
        scale=scale,
        rho=rho,
        repeats=repeats,
        seed=seed,
        device=device,
        dtype=str(dt),
        max_scores=max_scores,
        torch_threads=torch.get_num_threads(),
        timing="best of `repeats` wall-clock runs, same inputs for both methods",
    )
    return Result("tsc_bench_monte_carlo", rows, prov)


# ------------------------------------------------------------------------------ normalizers

BENCH_KS = (16, 64)
BENCH_LENGTHS = (128, 512, 1024)
BENCH_ALPHAS = (2.0, 1.5)


def _bench_scores(model, text: str, L: int) -> torch.Tensor:
    """Real scores [heads, L, L] of the model's middle layer on the text's first L tokens; masked
    (causal) keys are set far below every row's threshold (finite, as the entmax library needs)."""
    layer = model.n_layers // 2
    tr = model.capture(text_window(model, text, L), layers=[layer], keep=("scores",))
    s = tr.scores[0]
    vis = torch.isfinite(s)
    low = s.masked_fill(~vis, float("inf")).amin(-1, keepdim=True) - 1e4
    return torch.where(vis, s, low)


def _methods(alpha: float, ks: Sequence[int]):
    """(method, k, fn(x)) of the exact sort, partial sorts, bisection and attnlab's current `auto`."""
    from entmax import entmax15, entmax_bisect, sparsemax

    exact = {2.0: sparsemax, 1.5: entmax15}[alpha]
    out = [("sort", None, lambda x: exact(x, dim=-1))]
    out += [(f"topk{k}", k, (lambda k: lambda x: exact(x, dim=-1, k=k))(k)) for k in ks]
    out += [
        ("bisect", None, lambda x: entmax_bisect(x, alpha=alpha, dim=-1)),
        ("attnlab auto", None, lambda x: normalizers.entmax(x, None, alpha=alpha, method="auto")),
    ]
    return out


def _normalizer_cases(model, text: str, lengths: Sequence[int], dense: bool, g: torch.Generator) -> list[tuple]:
    """(case, L, scores [heads, L, L]): the model's real scores where L fits its positions, Gaussian scores of
    the same spread beyond, and the dense case (the longest L, sigma = 0.1)."""
    cases, sigma = [], None
    for L in sorted(lengths):
        if L <= model.max_positions:
            s = _bench_scores(model, text, L)
            sigma = float(s[torch.isfinite(s)].std())
            cases.append(("model", L, s))
    for L in sorted(lengths):
        if L > model.max_positions:
            sd = sigma if sigma is not None else 3.0
            cases.append(("gaussian", L, torch.randn(model.n_heads, L, L, generator=g) * sd))
    if dense:
        L = max(lengths)
        cases.append(("dense", L, torch.randn(model.n_heads, L, L, generator=g) * 0.1))
    return cases


def _time_normalizers(x: torch.Tensor, ks: Sequence[int], repeats: int) -> tuple[dict, dict]:
    """({(method, alpha): [seconds per run]}, {(method, alpha): output of the first run}) of softmax and every
    method of `_methods`, interleaved over `repeats` runs (bisection: the first run only)."""
    timings: dict = {}
    outputs: dict = {}
    plan = [("softmax", None, None, lambda z: torch.softmax(z, dim=-1))]
    for a in BENCH_ALPHAS:
        plan += [(m, k, a, f) for m, k, f in _methods(a, ks)]
    for rep in range(max(1, repeats)):
        for method, k, a, f in plan:
            if method == "bisect" and rep > 0:
                continue
            t0 = time.perf_counter()
            y = f(x)
            timings.setdefault((method, a), []).append(time.perf_counter() - t0)
            if rep == 0:
                outputs[(method, a)] = y
    return timings, outputs


def _normalizer_rows(case: str, L: int, x: torch.Tensor, timings: dict, outputs: dict, ks: Sequence[int],
                     repeats: int) -> list[dict]:
    """The rows of one case: softmax, then every method per alpha, against the full sort."""
    soft = min(timings[("softmax", None)])
    rows = [{"case": case, "L": L, "shape": list(x.shape), "alpha": None, "method": "softmax", "k": None,
             "seconds": soft, "ratio_softmax": 1.0, "ratio_sort": None, "max_abs_diff": None,
             "support_median": float(L), "repeats": repeats}]
    for a in BENCH_ALPHAS:
        ref = outputs[("sort", a)]
        sort_t = min(timings[("sort", a)])
        support = float((ref > 0).sum(-1).float().median())
        for method, k, _ in _methods(a, ks):
            t = min(timings[(method, a)])
            rows.append({"case": case, "L": L, "shape": list(x.shape), "alpha": a, "method": method, "k": k,
                         "seconds": t, "ratio_softmax": t / soft, "ratio_sort": t / sort_t,
                         "max_abs_diff": float((outputs[(method, a)] - ref).abs().max()),
                         "support_median": support, "repeats": 1 if method == "bisect" else repeats})
    return rows


def bench_normalizers(
    model="minilm",
    text=None,
    *,
    lengths: Sequence[int] = BENCH_LENGTHS,
    ks: Sequence[int] = BENCH_KS,
    repeats: int = 3,
    dense: bool = True,
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
) -> Result:
    """Time exact sparsemax / 1.5-entmax algorithms on [heads, L, L] score tensors (one attention layer).

    Cases: "model" = the model's real scores at L (middle layer, War and Peace); "gaussian" = i.i.d.
    N(0, sigma^2) scores with sigma = the std of the model's real scores, for L beyond the model's
    positions; "dense" (the longest L, sigma = 0.1: wide supports, the worst case for partial sorting).
    Methods: "sort" (full sort, the library default), "topk<k>" (partial sort over the top k, doubled
    until the support fits: exact), "bisect" (50 bisection steps), "attnlab auto" (what
    `normalizers.entmax(method="auto")` runs now, masking included); softmax for scale. Times are the
    minimum over `repeats` interleaved runs (bisection: one run, it is 5-50x slower). Rows: case, L,
    alpha, method, k, seconds, ratio_softmax, ratio_sort, max_abs_diff (vs sort), support_median.
    """
    t_start = time.perf_counter()
    if quick:
        lengths, repeats = (64,), 1
    model = as_attn_model(model)
    text, tprov = resolve_text(text)
    cases = _normalizer_cases(model, text, lengths, dense, torch.Generator().manual_seed(seed))
    rows = []
    for case, L, x in progress_bar(cases, progress, "bench normalizers"):
        x = x.float().contiguous()
        timings, outputs = _time_normalizers(x, ks, repeats)
        rows += _normalizer_rows(case, L, x, timings, outputs, ks, repeats)
        del outputs
    prov = provenance(
        experiment="bench_normalizers",
        **model.provenance(),
        **tprov,
        lengths=list(lengths),
        ks=list(ks),
        repeats=repeats,
        seed=seed,
        torch_threads=torch.get_num_threads(),
        note="times: minimum over interleaved repeats in this one run (bisection: one run); "
        "machine load from other processes inflates all of them alike",
        runtime_seconds=round(time.perf_counter() - t_start, 3),
    )
    return Result("bench_normalizers", rows, prov)


def recommend(result: Result) -> list[dict]:
    """Fastest exact method per (case, L, alpha) of a bench Result (max |diff| vs sort <= 1e-5),
    excluding attnlab's wrapper."""
    out = []
    for case in result.unique("case"):
        for L in sorted({r["L"] for r in result.select(case=case)}):
            for a in BENCH_ALPHAS:
                rs = [
                    r
                    for r in result.select(case=case, L=L, alpha=a)
                    if r["method"] != "attnlab auto" and (r["max_abs_diff"] or 0) <= 1e-5
                ]
                if rs:
                    best = min(rs, key=lambda r: r["seconds"])
                    sort = next(r for r in rs if r["method"] == "sort")
                    out.append(
                        {
                            "case": case,
                            "L": L,
                            "alpha": a,
                            "best": best["method"],
                            "speedup_vs_sort": sort["seconds"] / best["seconds"],
                            "support_median": best["support_median"],
                        }
                    )
    return out
