"""The critical top-N of Alg. 3 (Fig. 2c, the "6% rule") under every reading of E and d~ at once
(`attnlab.normalization.readings`): one scan over N serves every pair (E reading, d~ reading), with the same KS
protocol and the same certified early rejections as `critical_n.critical_n`.

The samples of a pair (e, d) at N are the per-head token means of d~ (reading d, the row's top N keys) and of E
(reading e): a closed form (E1, E2, E3, E5) or, for E4, the mean of d~ (reading d) over the nested random
N-subsets of `readings.random_orders` (`samples` per row). On CPU with the kernels on, everything comes from running
sums (`critical_n.RunningTopN`, one per order: the top order and each random order): brackets in O(D) per row and N
(O(1) for the closed forms, from per-row sums, `formula_brackets`) certify most rejections, and the exact values,
O(K) per row and N, are computed only where a pair needs them. Elsewhere (GPU, ATTNLAB_KERNELS=0) the same brackets
come from torch operations (`critical_n.bounds_head_means`, `formula_brackets`) and the exact values from
`distance_stats`: both paths certify the same N and record the same rows (tests/test_paths_agree.py).
`oracle.critical_n_readings` is the per-row reference; the tests check all three against each other.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.normalization.metrics.critical_n import (
    BRACKET_SLACK,
    RunningTopN,
    bounds_head_means,
    certified_rejections,
    ks_first_indistinguishable,
    new_scan_result,
    record_n,
    scan_n_max,
    scan_windows,
)
from attnlab.normalization.metrics.distance import distance_stats
from attnlab.normalization.metrics.engine import check_inputs, cpu_kernels, flatten_heads, row_mean
from attnlab.normalization.readings import D_READINGS, E_READINGS, FORMULA_E, random_orders

ALL_PAIRS = tuple((e, d) for e in E_READINGS for d in D_READINGS)
TOP_QUANTITIES = ("d_a", "d_b", "E1", "E2", "E3", "E5")   # from the top order (`kernels.EXACT_STATS`)
DEFAULT_SAMPLES = 2            # random subsets per row for E4 (two give each head mean's standard error)


def check_pairs(pairs) -> list[tuple[str, str]]:
    """[(e, d)] checked against the registries (ValueError naming the bad one); default every pair."""
    pairs = list(ALL_PAIRS if pairs is None else pairs)
    for e, d in pairs:
        if e not in E_READINGS or d not in D_READINGS:
            raise ValueError(f"unknown reading pair ({e!r}, {d!r}): E in {list(E_READINGS)}, d~ in {list(D_READINGS)}")
    if not pairs:
        raise ValueError("need at least one (E, d~) reading pair")
    return pairs


def _quantity(pair: tuple[str, str]) -> tuple[str, str]:
    """The two per-head samples of a pair: (top-N d~ key, E key); E4 is 'E4_a' / 'E4_b' (d~ of random subsets)."""
    e, d = pair
    return f"d_{d}", (f"E4_{d}" if e == "E4" else e)


class FormulaRows:
    """Per-row sums that bracket the closed forms E2, E3, E5 in O(1) per row and N (`formula_brackets`; on the CPU
    kernels `reading_kernels.formula_brackets`), for `sum_i ||l_i x_i - mu xbar||` with l_i = a_i + c, c = N / (L - 1):
    SA = sum a_i^2 ||x_i||^2, Syn = sum a_i ||x_i||, San = sum a_i ||x_i||^2, Sn = sum ||x_i||, Sn2 = sum ||x_i||^2,
    and the dot products oo, oX, XX of o = sum a_i x_i and Xs = sum x_i, over the row's visible keys. Each [B, Q]
    float64. P [B, Q, K] the weights, Xu [u, K, D] float64 the distinct x (inv [B] head -> x), vis bool [Q, K], and
    o [B, Q, D], SA, Syn [B, Q] when the caller has them (`RunningTopN`: `of_scan`)."""

    def __init__(self, P, Xu, inv, vis, o=None, SA=None, Syn=None):
        visf = vis.double()                                              # [Q, K]
        xn2 = (Xu * Xu).sum(-1)                                          # [u, K]
        xn = xn2.sqrt()
        B, Q = P.shape[0], vis.shape[0]
        made = o is None
        if made:
            o = torch.empty(B, Q, Xu.shape[-1], dtype=torch.float64, device=P.device)
            SA, Syn = (torch.empty(B, Q, dtype=torch.float64, device=P.device) for _ in range(2))
        San = torch.empty(B, Q, dtype=torch.float64, device=P.device)
        for b0 in range(0, B, 16):                                       # (a [16, Q, K] float64 at a time)
            bs = slice(b0, min(B, b0 + 16))
            a = P[bs].double() * visf
            San[bs] = torch.bmm(a, xn2[inv[bs]].unsqueeze(-1)).squeeze(-1)
            if made:
                o[bs] = torch.bmm(a, Xu[inv[bs]])
                yn = a * xn[inv[bs]].unsqueeze(1)
                SA[bs], Syn[bs] = (yn * yn).sum(-1), yn.sum(-1)
        Xs = torch.matmul(visf, Xu)[inv]                                 # [B, Q, D]
        self.sums = {"SA": SA, "Syn": Syn, "San": San, "Sn": (visf @ xn.T).T[inv], "Sn2": (visf @ xn2.T).T[inv],
                     "oo": (o * o).sum(-1), "oX": (o * Xs).sum(-1), "XX": (Xs * Xs).sum(-1)}
        self.Lt = visf.sum(-1)

    @classmethod
    def of_scan(cls, scan: RunningTopN) -> "FormulaRows":
        """From the CPU scan's tensors (its o, SA, Syn reused)."""
        return cls(scan.P, scan.Xu, scan.inv, scan.vis, scan.o, scan.SA, scan.Syn)

    @classmethod
    def of_tensors(cls, probs: torch.Tensor, x: torch.Tensor, vis: torch.Tensor) -> "FormulaRows":
        """From probs [..., Q, K], x [..., K, D] and vis bool [Q, K] (torch operations, any device)."""
        _, P, X, xmap = flatten_heads(probs, x)
        uniq, inv = torch.unique(xmap, return_inverse=True)
        return cls(P, X[uniq.to(X.device)].double(), inv.to(P.device), vis)

    def brackets(self, readings, ns: Sequence[int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{reading: (lo, hi) per-head means [B, len(ns)]} for the closed forms among E2, E3, E5 in `readings`: the
        triangle inequality (`||sum w_i|| <= sum ||w_i||`, `|sum l_i ||x_i|| - L mu ||xbar||| <= sum ||w_i|| <=
        sum l_i ||x_i|| + L mu ||xbar||`) and Cauchy-Schwarz (`sum ||w_i|| <= sqrt(L sum ||w_i||^2)`, the sum of
        squares in closed form), with the bracket slack of `critical_n`."""
        if list(ns) != list(range(ns[0], ns[0] + len(ns))):
            raise ValueError(f"the N of a bracket window must be consecutive, got {list(ns)}")
        if cpu_kernels(self.sums["SA"]) is not None:
            from attnlab.normalization.kernels import readings as kernels

            sums = kernels.formula_brackets(self.sums, self.Lt, ns[0], len(ns), readings, BRACKET_SLACK)
        else:
            sums = formula_brackets(self.sums, self.Lt, ns, readings, BRACKET_SLACK)
        count = (self.Lt.cpu().unsqueeze(-1) > torch.tensor(ns, dtype=torch.float64)).sum(0).double()
        means = (sums / count).numpy()
        return {r: (means[2 * i], means[2 * i + 1]) for i, r in enumerate(("E2", "E3", "E5")) if r in readings}


def formula_brackets(sums: dict, Lt: torch.Tensor, ns: Sequence[int], readings, slack: float,
                     elements: int = 1 << 22) -> torch.Tensor:
    """`reading_kernels.formula_brackets` as torch operations (GPU, ATTNLAB_KERNELS=0): float64 [6, B, len(ns)], lo
    and hi of E2, E3, E5 (those in `readings`) summed over the rows with Lt > N, from the per-row sums [B, Q] of
    `FormulaRows` (the same closed forms; see the kernel), over blocks of heads of at most `elements` [b, Q, N]."""
    B, Q = sums["SA"].shape
    dev = sums["SA"].device
    N = torch.tensor(list(ns), dtype=torch.float64, device=dev)         # [W]
    L = Lt.to(dev, torch.float64).view(Q, 1)
    valid = L > N                                                        # [Q, W]
    c = N / (L - 1).clamp_min(1)
    scale = (L - N) / L
    out = torch.zeros(6, B, len(N), dtype=torch.float64)
    step = max(1, elements // (Q * len(N)))
    for b0 in range(0, B, step):
        s = {k: v[b0:b0 + step].unsqueeze(-1) for k, v in sums.items()}   # [b, Q, 1]
        T1 = s["Syn"] + c * s["Sn"]
        base = s["SA"] + 2 * c * s["San"] + c * c * s["Sn2"]
        for r, name in enumerate(("E2", "E3", "E5")):
            if name not in readings:
                continue
            if name == "E2":
                mu, xx = torch.ones_like(c), s["XX"] / (L * L)
                cross = (s["oX"] + c * s["XX"]) / L
                V = s["oo"] - 2 * (1 - c) * s["oX"] + (1 - c) ** 2 * s["XX"]
            else:
                mu, xx = (c if name == "E3" else torch.ones_like(c)), s["oo"]
                cross = s["oo"] + c * s["oX"]
                k = 1 - L * mu
                V = k * k * s["oo"] + 2 * k * c * s["oX"] + c * c * s["XX"]
            Lmx = L * mu * xx.clamp_min(0).sqrt()
            sq = (base - 2 * mu * cross + L * mu * mu * xx).clamp_min(0)
            lo = scale * torch.maximum(V.clamp_min(0).sqrt(), (T1 - Lmx).abs())
            hi = scale * torch.minimum(T1 + Lmx, (L * sq).sqrt())
            out[2 * r, b0:b0 + step] = torch.where(valid, lo * (1 - slack) - 1e-12, 0.0).sum(1).cpu()
            out[2 * r + 1, b0:b0 + step] = torch.where(valid, hi * (1 + slack) + 1e-12, 0.0).sum(1).cpu()
    return out


def _rel_se(samples: list[np.ndarray], c: int) -> float:
    """Median over heads of the standard error of the E4 head mean relative to it, at column c: from the spread of
    the per-sample head means (two samples: |m1 - m2| / 2)."""
    if len(samples) < 2:
        return float("nan")
    m = np.stack([s[:, c] for s in samples])                            # [S, B]
    se = m.std(0, ddof=1) / np.sqrt(len(samples))
    mean = m.mean(0)
    ok = np.isfinite(se) & (mean != 0)
    return float(np.median(se[ok] / np.abs(mean[ok]))) if ok.any() else float("nan")


def critical_n_readings(probs: torch.Tensor, x: torch.Tensor, visible: Optional[torch.Tensor] = None, *,
                        pairs=None, alpha: float = 0.01, n_max: Optional[int] = None, seed: int = 0,
                        samples: int = DEFAULT_SAMPLES, certify: bool = True, block: int = 8,
                        progress=None, orders: Optional[list] = None) -> dict[tuple[str, str], dict]:
    """Critical N (Alg. 3) of every reading pair (e, d): {pair: dict as `critical_n.critical_n` returns (n, ns,
    pvalues, ks, exact, p_upper, d_mean, e_mean) plus e_rel_se (E4: median relative standard error of the head
    means at the N computed exactly; NaN elsewhere)}. Every N from 1 up is tested for each pair until its first
    non-rejection (p > alpha) or n_max (default L - 1). The last N that has rows is never certified: a pair that
    finds no critical N ends on an exact p-value and exact means (not an upper bound and bracket midpoints), on both
    paths. probs [..., Q, K] (heads = leading dims), x [..., K, D], visible [Q, K]; `seed`, `samples`: the random
    subsets of E4; `orders`: those subsets when the caller made them already (`random_orders(lead, visible, seed,
    s)` for s < samples, [..., Q, K] each: they depend on the rows' visible keys only, not on x)."""
    vis = check_inputs(probs, x, visible)
    pairs = check_pairs(pairs)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if int(samples) < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    n_max = scan_n_max(probs.shape[-1], n_max)
    last = min(n_max, int(vis.sum(-1).max()) - 1)                       # the last N with a row (L_t > N)
    lead = probs.shape[:-2]
    e4 = any(e == "E4" for e, _ in pairs)
    orders = ([random_orders(lead, vis, seed, s) for s in range(samples)] if orders is None else orders) if e4 else []
    scan = _KernelScan(probs, x, vis, n_max, orders) if cpu_kernels(probs) is not None else \
        _TorchScan(probs, x, vis, orders)
    out = {p: new_scan_result("e_rel_se") for p in pairs}
    todo = list(pairs)
    for ns in scan_windows(n_max, block, certify):
        cert: dict = {p: {} for p in todo}
        if certify and scan.brackets_ok:
            br = scan.brackets(ns, todo)
            for p in todo:
                dq, eq = _quantity(p)
                cert[p] = certified_rejections(*br[dq], *br[eq], ns, alpha)
                cert[p].pop(last, None)
        exact: dict = {}                     # quantity -> {N: head values [B]}; "E4_*#s": per sample
        pos = {p: 0 for p in todo}
        nb = 8
        while True:
            blocked = {}
            for p in list(todo):
                dq, eq = _quantity(p)
                res = out[p]
                while pos[p] < len(ns):
                    N = ns[pos[p]]
                    if N in cert[p]:
                        p_up, dm, em = cert[p][N]
                        record_n(res, N, float("nan"), float("nan"), False, p_up, dm, em, e_rel_se=float("nan"))
                    elif N in exact.get(dq, {}) and N in exact.get(eq, {}):
                        d, e = exact[dq][N], exact[eq][N]
                        n, ps, ks = ks_first_indistinguishable(d[:, None], e[:, None], [N], alpha)
                        if not ps:                       # no row left for this N
                            todo.remove(p)
                            break
                        se = exact.get(eq + "#se", {}).get(N, float("nan"))
                        record_n(res, N, ps[0], ks[0], True, ps[0], float(np.nanmean(d)), float(np.nanmean(e)),
                                 e_rel_se=se)
                        if n == N:
                            res["n"] = N
                            todo.remove(p)
                            break
                    else:
                        blocked[p] = N
                        break
                    pos[p] += 1
            if not blocked:
                break
            want: dict = {}                  # quantity -> the next N (up to nb per pair) the blocked pairs need
            for p, N0 in blocked.items():
                nxt = [N for N in ns if N >= N0 and N not in cert[p]][:nb]
                for q in _quantity(p):
                    want.setdefault(q, set()).update(N for N in nxt if N not in exact.get(q, {}))
            for q, vals in scan.exact(want).items():
                exact.setdefault(q, {}).update(vals)
            nb = min(2 * nb, 64)
        if progress is not None:
            progress.update(len(ns))
        if not todo:
            break
    return out


class _KernelScan:
    """CPU kernels: running sums over the top order and each random order (`RunningTopN`)."""

    brackets_ok = True

    def __init__(self, probs, x, vis, n_max, orders):
        self.top = RunningTopN(probs, x, vis, n_max)
        self.rand = [self.top.reordered(o) for o in orders]
        self.formula = None
        self.Lt = self.top.Lt

    def brackets(self, ns, pairs) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{quantity: (lo, hi) per-head means [B, len(ns)]} for the quantities of `pairs` (the running sums of every
        order advance; the random ones only while a pair still needs E4)."""
        hm = self.top.brackets(ns)
        da = hm["d_a"]
        out = {"d_a": (da * (1 - BRACKET_SLACK) - 1e-12, da * (1 + BRACKET_SLACK) + 1e-12),
               "d_b": (hm["d_b_lo"], hm["d_b_hi"]), "E1": (hm["e_lo"], hm["e_hi"])}
        wanted = {e for e, _ in pairs}
        if set(FORMULA_E[1:]) & wanted:
            if self.formula is None:
                self.formula = FormulaRows.of_scan(self.top)
            out.update(self.formula.brackets(wanted, ns))
        if "E4" in wanted:
            rb = [r.brackets(ns) for r in self.rand]
            da = np.mean([b["d_a"] for b in rb], 0)
            out["E4_a"] = (da * (1 - BRACKET_SLACK) - 1e-12, da * (1 + BRACKET_SLACK) + 1e-12)
            out["E4_b"] = (np.mean([b["d_b_lo"] for b in rb], 0), np.mean([b["d_b_hi"] for b in rb], 0))
        return out

    def exact(self, want: dict) -> dict[str, dict]:
        """{quantity: {N: per-head means [B]}} for want = {quantity: set of N} (and "E4_*#se": {N: the relative
        standard error}): one pass of the top order for its quantities, one per random order for E4."""
        out: dict = {}
        top = {q: n for q, n in want.items() if q in TOP_QUANTITIES and n}
        if top:
            ns = sorted(set().union(*top.values()))
            vals = self.top.exact(ns, need=list(top))
            for q in top:
                out[q] = {N: vals[q][:, c] for c, N in enumerate(ns)}
        for d in ("a", "b"):
            ns = sorted(want.get(f"E4_{d}", ()))
            if ns:
                per = [r.exact(ns, need=(f"d_{d}",))[f"d_{d}"] for r in self.rand]
                out[f"E4_{d}"] = {N: np.mean(per, 0)[:, c] for c, N in enumerate(ns)}
                out[f"E4_{d}#se"] = {N: _rel_se(per, c) for c, N in enumerate(ns)}
        return out


class _TorchScan:
    """No kernels (GPU, ATTNLAB_KERNELS=0): the brackets of `_KernelScan` from `critical_n.bounds_head_means` (top and
    random orders) and `formula_brackets`, the exact values from `distance_stats`."""

    brackets_ok = True

    def __init__(self, probs, x, vis, orders):
        self.probs, self.x, self.vis, self.orders = probs, x, vis, orders
        self.formula = None

    def brackets(self, ns, pairs) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """As `_KernelScan.brackets`, for the quantities of `pairs` only."""
        need = {q for p in pairs for q in _quantity(p)}
        out = {}
        for d in ("a", "b"):
            if f"d_{d}" in need:
                hm = bounds_head_means(self.probs, self.x, ns, self.vis, d)
                out[f"d_{d}"], out["E1"] = (hm["d_lo"], hm["d_hi"]), (hm["e_lo"], hm["e_hi"])
            if f"E4_{d}" in need:
                rb = [bounds_head_means(self.probs, self.x, ns, self.vis, d, order=o) for o in self.orders]
                out[f"E4_{d}"] = (np.mean([b["d_lo"] for b in rb], 0), np.mean([b["d_hi"] for b in rb], 0))
        closed = need & set(FORMULA_E[1:])
        if closed:
            if self.formula is None:
                self.formula = FormulaRows.of_tensors(self.probs, self.x, self.vis)
            out.update(self.formula.brackets(closed, ns))
        return out

    def exact(self, want: dict) -> dict[str, dict]:
        """As `_KernelScan.exact`, from `distance_stats` (the top N, and each random order for E4)."""
        names = {"d_a": "dtilde_a", "d_b": "dtilde_b", "E1": "E", "E2": "E2", "E3": "E3", "E5": "E5"}
        out: dict = {}
        top = {q: n for q, n in want.items() if q in names and n}
        if top:
            ns = sorted(set().union(*top.values()))
            st = distance_stats(self.probs, self.x, ns, self.vis, stats=[names[q] for q in top])
            for q in top:
                m = row_mean(st[names[q]], dim=-2).reshape(-1, len(ns)).numpy()
                out[q] = {N: m[:, c] for c, N in enumerate(ns)}
        for d in ("a", "b"):
            ns = sorted(want.get(f"E4_{d}", ()))
            if ns:
                per = [row_mean(distance_stats(self.probs, self.x, ns, self.vis, stats=(f"dtilde_{d}",),
                                               order=o)[f"dtilde_{d}"], dim=-2).reshape(-1, len(ns)).numpy()
                       for o in self.orders]
                out[f"E4_{d}"] = {N: np.mean(per, 0)[:, c] for c, N in enumerate(ns)}
                out[f"E4_{d}#se"] = {N: _rel_se(per, c) for c, N in enumerate(ns)}
        return out
