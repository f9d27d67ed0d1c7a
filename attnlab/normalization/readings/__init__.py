"""Readings: the registry (this file) of every defensible reading of a formula that arXiv 2508.17821 leaves
open, and beside it one module per statement those readings change, each with its experiment, claim rows and
plots: `theorem1` (d~ and E, Fig. 2a's curves), `six_percent` (the critical N of every reading pair),
`theorem2` (separability, Fig. 3), `lemma2` (Fig. 4's slope). Data flows registry -> modules -> figures.

The registry, one place for every reading: the name each
Result, claim row, plot and chapter uses, what it computes, and where it comes from (labels of the book's
appendix "How we read the papers": [P] paper, [B] printed in a published summary, [R] reconstruction,
[G] gap). The first entry of each registry is the book's default reading.

- `E_READINGS`: the random-set expectation E of Theorem 1 (Fig. 2a's blue curve, Alg. 3's second sample);
- `D_READINGS`: the representation distance d~ (gap G1);
- `VECTORS`: the vectors x_i (gap G4; Algorithm 4 says "normalize token embeddings");
- `RADII`, `ROW_SETS`, `SEP_AGGREGATES`: N_s/N of Theorem 2 / Fig. 3 (gaps G9, G10);
- `XI_READINGS`, `UPPER_FORMS`: the spread xi_i and the upper bound's constant of Theorem 2;
- `G_AGGREGATES`, `DIRECTIONS`: g(T, eps) of Fig. 4 / Alg. 5 (eps is the paper's own grid).

`vectors(trace, name)` builds the x_i of a reading from a Trace. Pure definitions and small tensor functions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: the longest window of the reading-by-reading Results (theorem1's curves, separability_readings,
#: gradient_readings) unless a length is asked for: the longest both offline models share (MiniLM has 512
#: positions), so their reading tables compare like with like, and SmolLM2's 270 heads at L = 1024 would
#: add about ten minutes of CPU to a build that already has the paper's figures to L = 1024
MAX_LENGTH = 512


@dataclass(frozen=True)
class Reading:
    label: str      # short, for tables and selectors
    source: str     # where it comes from, with its label ([P], [B], [R], [G])
    formula: str    # the formula in LaTeX (typeset by the book's tables)


def _sum_e(term: str) -> str:
    """LaTeX of E = (L-N)/L sum_i ||term||."""
    return r"\(E = \frac{L-N}{L} \sum_i \big\| " + term + r" \big\|\)"


E_READINGS: dict[str, Reading] = {
    "E1": Reading("main sum", "[R]/[B] the main sum of the expectation over uniformly random N-subsets (Jensen: "
                  "E1 <= E4); the printed [B] formula with x-bar = N/(L-1) sum_j a_j x_j and the factor read as "
                  "a_i (1 + N/(L-1)); the book's default",
                  _sum_e(r"\alpha_i x_i - \frac{N}{L-1} \sum_{j \ne i} \alpha_j x_j")),
    "E2": Reading("printed, x-bar = mean", "[B] the published summary's formula read literally, (a_i + N/(L-1)) "
                  "x_i, with x-bar the plain mean of the x_j (x-bar is undefined in the summary)",
                  _sum_e(r"(\alpha_i + \frac{N}{L-1})\, x_i - \frac{1}{L} \sum_j x_j")),
    "E3": Reading("printed, x-bar = N/(L-1) sum a x", "[B] the printed formula read literally with "
                  "x-bar = N/(L-1) sum_j a_j x_j",
                  _sum_e(r"(\alpha_i + \frac{N}{L-1})\, x_i - \frac{N}{L-1} \sum_j \alpha_j x_j")),
    "E4": Reading("exact expectation (Monte Carlo)", "[R] the exact expectation of d~ over uniformly random "
                  "N-subsets (the paper's Eq. 8 before any approximation), seeded Monte Carlo: nested random "
                  "subsets, two per row, with the standard error of each head mean",
                  r"\(E = \mathbb{E}_{I_N}\, \tilde d(I_N)\)"),
    "E5": Reading("printed, x-bar = sum a x", "[B] the printed formula read literally with x-bar = sum_j a_j x_j, "
                  "the attention-weighted mean (the head's output)",
                  _sum_e(r"(\alpha_i + \frac{N}{L-1})\, x_i - \sum_j \alpha_j x_j")),
}
FORMULA_E = ("E1", "E2", "E3", "E5")        # closed forms; E4 is an expectation estimated by Monte Carlo

D_READINGS: dict[str, Reading] = {
    "b": Reading("sum of distances", "[R] the paper's prose ('cumulative distance between s and all "
                 "non-selected embeddings', Cor. 2(ii), linear growth in Fig. 2a); the book's default",
                 r"\(\tilde d = \sum_{i \notin I_N} \| \alpha_i x_i - s \|\)"),
    "a": Reading("distance of the sum", "[S] as typeset in the Moonlight review",
                 r"\(\tilde d = \| \sum_{i \notin I_N} \alpha_i x_i - s \|\)"),
}

#: the (E, d~) pairs that read a formula of the paper: every E with d~ (b), whose closed forms are expectations of
#: a sum of per-token distances; and E4, the expectation of d~ itself, with d~ (a) too. E1, E2, E3 and E5 with
#: d~ (a) compare a distance of a sum with an expectation of a sum of distances, which no formula of the paper
#: does: they are computed and shown, never counted among the readings (`paper_tally`)
PAPER_PAIRS = tuple((e, "b") for e in E_READINGS) + (("E4", "a"),)


def is_paper_pair(e: str, d: str) -> bool:
    return (e, d) in PAPER_PAIRS


def paper_tally(rows) -> dict:
    """How many claim rows labelled "E / d / vectors" hold among those whose (E, d~) is one of PAPER_PAIRS:
    dict(holds, of, cross_pairs = rows of the other pairs, left out of the count)."""
    pairs = [tuple(r["reading"].split(" / ")[:2]) for r in rows]
    paper = [r for r, p in zip(rows, pairs) if p in PAPER_PAIRS]
    return {"holds": sum(r["verdict"] == "holds" for r in paper), "of": len(paper),
            "cross_pairs": len(rows) - len(paper)}


_BASE_VECTORS = {
    "v": ("value vectors", "[G4] default: the head's value vectors (the authors' follow-up paper uses weighted "
          "value vectors)"),
    "k": ("key vectors", "[G4] the head's key vectors"),
    "hidden_head": ("layer input, head slice", "[G4] the layer-input hidden state (GPT-2: after ln_1), the slice "
                    "of coordinates h*d_head .. (h+1)*d_head of head h"),
    "hidden": ("layer input, whole", "[G4] the whole layer-input hidden state, the same vectors for every head of "
               "a layer (each head with its own weights)"),
}
VECTORS: dict[str, Reading] = {}
for _name, (_label, _source) in _BASE_VECTORS.items():
    VECTORS[_name] = Reading(_label, _source + "; raw", r"\(x_i\)")
    VECTORS[f"{_name}_unit"] = Reading(_label + ", unit", _source + "; L2-normalized (Algorithm 4: 'normalize "
                                       "token embeddings')", r"\(x_i / \|x_i\|\)")

RADII: dict[str, Reading] = {
    "nearest": Reading("nearest non-selected, strict", "[P] r = min_{i out} ||a_i x_i - s|| (Sec. 3.2), [R] "
                       "strict < so that the nearest non-selected token is outside; the book's default",
                       r"\(N_s = \#\{i \in I_N : \|\alpha_i x_i - s\| < r\}\)"),
    "closed": Reading("nearest non-selected, closed ball", "[P] the same r with the closed ball B_r(s) of the "
                      "definition (<=): the nearest non-selected token then sits on the boundary",
                      r"\(N_s = \#\{i \in I_N : \|\alpha_i x_i - s\| \le r\}\)"),
}
ROW_SETS: dict[str, Reading] = {
    "positive_r": Reading("rows with r > 0", "[G10] rows where the ball has a positive radius (the default)",
                          r"rows with \(L_t > N\) and \(r > 0\)"),
    "all": Reading("every row", "[G10] every row with L_t > N; a row with r = 0 counts N_s = 0",
                   r"rows with \(L_t > N\)"),
}
SEP_AGGREGATES: dict[str, Reading] = {
    "median": Reading("median over heads", "[G9] the box plots' median of the per-head token means (default)",
                      r"\(\mathrm{median}_h\, \mathrm{mean}_t\, N_s/N\)"),
    "mean": Reading("mean over heads", "[G9] the mean over heads of the token means",
                    r"\(\mathrm{mean}_h\, \mathrm{mean}_t\, N_s/N\)"),
    "q75": Reading("upper quartile", "[G9] the upper edge of the box", r"\(q_{75\%,h}\, \mathrm{mean}_t\, N_s/N\)"),
    "max": Reading("max over heads", "[P] 'the exponential upper bound tracks the empirical maxima'",
                   r"\(\max_h\, \mathrm{mean}_t\, N_s/N\)"),
}
G_AGGREGATES: dict[str, Reading] = {
    "max_head_mean": Reading("max over heads of the token mean", "[P] Algorithm 5: average over tokens, store the "
                             "maximum over the (head, layer) pairs (the default)", r"\(\max_h\, \mathrm{mean}_t\, g\)"),
    "median_head_mean": Reading("median over heads of the token mean", "[G] a typical head",
                                r"\(\mathrm{median}_h\, \mathrm{mean}_t\, g\)"),
    "max_row": Reading("max over rows", "[G] the worst row of any head (no average over tokens)", r"\(\max_{h,t} g\)"),
}
DIRECTIONS: dict[str, Reading] = {
    "gaussian": Reading("Gaussian unit vector", "[G] v = z/||z||, z ~ N(0, I) over the visible keys, one per row "
                        "(the default)", r"\(v = z/\|z\|,\ z \sim N(0, I)\)"),
    "rademacher": Reading("random signs", "[G] v = z/||z|| with z_i = -+1 over the visible keys",
                          r"\(v = z/\|z\|,\ z_i \in \{-1, 1\}\)"),
    "worst": Reading("worst direction (eps -> 0)", "[R] the Jacobian's top singular vector: g -> ||grad alpha||_2, "
                     "the exact spectral norm, on sampled rows",
                     r"\(g = \|(\mathrm{diag}(\alpha) - \alpha\alpha^\top)/T\|_2\)"),
}
XI_READINGS: dict[str, Reading] = {
    "row": Reading("the row's own distance", "[B] 'xi_i = E||a_i x_i - s||, estimated as the row's ||a_i x_i - s||' "
                   "(the default; with it the lower bound is a theorem row by row: 1{X < r} >= 1 - X/r)",
                   r"\(\xi_i = \|\alpha_i x_i - s\|\)"),
    "pair": Reading("mean pairwise spread", "[B] 'or the mean over the other selected ||a_j x_j - a_i x_i||' "
                    "(0 at N = 1)",
                    r"\(\xi_i = \mathrm{mean}_{j \in I_N, j \ne i} \|\alpha_j x_j - \alpha_i x_i\|\)"),
    "delta": Reading("from the minimum separation", "[R] the bound on E||s - a_i x_i||^2 from Assumptions 1-2 "
                     "(sphere of radius M, pairwise distance >= delta, the row's empirical minimum)",
                     r"\(\xi_i^2 = M^2 \sum_{j \ne i} \alpha_j^2 + (M^2 - \delta^2/2) \sum_{j \ne k;\, j, k \ne i} "
                     r"\alpha_j \alpha_k\)"),
}
UPPER_FORMS: dict[str, Reading] = {
    "B": Reading("16 M^2 (as printed)", "[B] the published summary's upper bound (the default)",
                 r"\(\frac{1}{N} \sum_i e^{-(r - \xi_i)^2 / (16 M^2)}\)"),
    "R": Reading("2 M^2 (Hoeffding, range 2M)", "[R] reconstruction from the proof sketch ('Hoeffding-type')",
                 r"\(\frac{1}{N} \sum_i e^{-(\xi_i - r)_+^2 / (2 M^2)}\)"),
}


def vectors(trace, name: str) -> torch.Tensor:
    """x [layer, head | 1, K, D] of the vector reading `name` (see `VECTORS`) from a Trace that kept what it
    needs ("v", "k" or "hidden"). Unit readings put each x_i on the unit sphere (zero vectors stay zero)."""
    if name not in VECTORS:
        raise ValueError(f"unknown vectors {name!r}; choose from {', '.join(VECTORS)}")
    base = name.removesuffix("_unit")
    if base in ("v", "k"):
        x = getattr(trace, base)
        if x is None:
            raise ValueError(f"vectors {name!r} need a trace that kept {base!r}")
    else:
        if trace.hidden is None:
            raise ValueError(f"vectors {name!r} need a trace that kept 'hidden'")
        x = trace.hidden.unsqueeze(1)                                    # [layer, 1, K, d_model]
        if base == "hidden_head":
            x = head_slices(trace.hidden, trace.heads, _d_head(trace))
    if name.endswith("_unit"):
        n = x.norm(dim=-1, keepdim=True)
        x = torch.where(n > 0, x / n.clamp_min(1e-30), torch.zeros_like(x))
    return x


def head_slices(hidden: torch.Tensor, heads, d_head: int) -> torch.Tensor:
    """[layer, head, K, d_head]: the coordinates h*d_head .. (h+1)*d_head of hidden [layer, K, d_model] for each
    head h of `heads`."""
    if hidden.shape[-1] % d_head:
        raise ValueError(f"hidden width {hidden.shape[-1]} is not a multiple of d_head = {d_head}")
    parts = hidden.unflatten(-1, (hidden.shape[-1] // d_head, d_head))  # [layer, K, H, d_head]
    return parts[:, :, list(heads)].permute(0, 2, 1, 3)


def _d_head(trace) -> int:
    for t in (trace.v, trace.k, trace.q):
        if t is not None:
            return int(t.shape[-1])
    d = trace.meta.get("d_head")
    if d is None:
        raise ValueError("vectors 'hidden_head' need the head width: capture 'v' or 'k' beside 'hidden'")
    return int(d)


def random_orders(lead, visible: torch.Tensor, seed: int = 0, sample: int = 0) -> torch.Tensor:
    """Seeded uniformly random orders of each row's visible keys (then its invisible keys, by index): int16 (int32
    for K >= 2^15) [*lead, Q, K]. The first N keys of a row are a uniformly random N-subset of its visible keys,
    nested in N (reading E4). Fisher-Yates with a counter-based generator per (seed, sample, flattened head, row)
    (`reading_kernels.random_orders`): the same orders on every machine, whatever the threads or chunking.
    visible bool [Q, K]."""
    import numpy as np

    from attnlab.normalization.kernels import readings as kernels

    Q, K = visible.shape
    B = int(np.prod([int(n) for n in lead])) if len(lead) else 1
    seeds = [((int(seed) * 1_000_003 + int(sample)) * 1_000_003 + b) % (1 << 64) for b in range(B)]
    out = kernels.random_orders(visible.cpu().bool(), np.array(seeds, np.uint64),
                                torch.int16 if K < 1 << 15 else torch.int32)
    return out.reshape(*lead, Q, K)


def needs(vector_names) -> set[str]:
    """The Trace tensors the vector readings need (for `capture(keep=...)`)."""
    out = set()
    for name in vector_names:
        base = name.removesuffix("_unit")
        out |= {"v"} if base == "v" else {"k"} if base == "k" else {"hidden", "v"} if base == "hidden_head" \
            else {"hidden"}
    return out


def describe(registry: dict[str, Reading], name: str) -> str:
    """'name (label): source' for provenance and tables."""
    r = registry[name]
    return f"{name} ({r.label}): {r.source}"


def check_names(what: str, names, registry: dict) -> None:
    """One ValueError naming the unknown entries of `names` and the registry's choices."""
    bad = [n for n in names if n not in registry]
    if bad:
        raise ValueError(f"unknown {what} {bad}; choose from {', '.join(registry)}")


def undefined_vectors(model) -> dict[str, str]:
    """{vectors name: why `model` has no such vectors}: the head slices of the hidden state ("hidden_head" and its
    unit reading) where the hidden width is not heads x d_head (Gemma 3 270M: 640 against 4 x 256), so that no slice
    of it belongs to one head. Every other reading is defined on every model."""
    d_model, H, d = getattr(model, "d_model", None), int(model.n_heads), int(model.d_head)
    if not d_model or d_model == H * d:
        return {}
    why = f"hidden width {d_model} is not heads x d_head = {H} x {d}: no slice of it belongs to one head"
    return {n: why for n in VECTORS if n.removesuffix("_unit") == "hidden_head"}


def model_vectors(model, names=None) -> list[str]:
    """The vectors readings to compute on `model`: `names` (None: every reading of VECTORS that `model` defines,
    `undefined_vectors`), checked: one ValueError for an unknown name or one `model` does not define."""
    missing = undefined_vectors(model)
    if names is None:
        return [n for n in VECTORS if n not in missing]
    names = list(names)
    check_names("vectors", names, VECTORS)
    bad = [n for n in names if n in missing]
    if bad:
        raise ValueError(f"vectors {', '.join(bad)} are not defined on {model.name}: {missing[bad[0]]}")
    return names
