"""The block engine shared by every per-row metric of arXiv 2508.17821: input checks, (heads, rows)
blocks, top-N orders, and the root sums of Theorem 1. Pure functions on tensors.

Inputs (all torch tensors):

- `probs [..., Q, K]`: attention weights (0 on masked keys), leading dims e.g. [layer, head];
- `x [..., K, D]`: the vectors x_i of the paper (per-head value vectors by default); its leading dims
  broadcast against those of probs (layer-input hidden states `[layer, 1, K, D]` serve every head);
- `visible bool [Q, K]`: keys each query row counts (default: all). A row's length is
  `L_t = visible[t].sum()`; rows with `L_t <= N` are skipped (NaN in per-row outputs).
  Protocol "masked keys included" = pass `visible=None` (all keys, weight 0 where masked).

Work is done on blocks of (heads, query rows) (`chunk` = elements of one [heads, rows, K] block,
8 MiB in float64: big enough to amortise the ~10-20 us overhead of each torch operation, small
enough to bound memory: a 12 x 12 model at L = 1024 keeps a few such blocks per tensor). Top-N =
the first N keys of each row by weight, descending, ties broken by the lower key index: one top-k
per block serves every N.

Sums of distances over the K keys never form [rows, K, D] tensors: squared norms are expanded in
dot products, `||a_i x_i - s||^2 = a_i (a_i ||x_i||^2 - 2 x_i.s) + ||s||^2`, and each sum costs at
most one matrix product and one pass over the keys. The squares are float64 (the critical-N scan's
inputs: float32), where the cancellation happens; their square roots are float32 (~1e-7 relative;
float64 roots are 4x slower on CPU), their sums float64.

On CPU the per-key loops (the root sums, a small top-k, the d1 lookups, the running top-N sums of the
critical-N scan) run as numba kernels (`attnlab.normalization.kernels.metrics`, `FUSED`): one pass per row where
torch makes one per operation.
Elsewhere (GPU, or ATTNLAB_KERNELS=0) the same formulas run as torch operations.
`attnlab.normalization.oracle` recomputes everything row by row, directly from the formulas; the
tests check both engines against it, to 1e-5 relative. Functions accept tensors on any device;
per-row outputs come back on the CPU.
"""
from __future__ import annotations

import bisect
from typing import Iterable, Iterator, Optional, Sequence

import torch

from attnlab.core.util import kernels_on, last_visible

DEFAULT_CHUNK = 1 << 20          # elements of one [heads, rows, K] block (8 MiB in float64)
# CPU: the hot loops run as the numba kernels of `normalization.kernels.metrics`; False (or ATTNLAB_KERNELS=0): plain
# torch everywhere, the path GPUs take (the tests check both against the oracle)
FUSED = kernels_on()
SMALL_N = 16                     # N <= SMALL_N: d1 from each key's farthest visible key (else candidates),
                                 # x_i.s from the d1 table, top-k by insertion (CPU)


# ----------------------------------------------------------------------------------------- checking

def check_inputs(probs: torch.Tensor, x: Optional[torch.Tensor] = None,
                 visible: Optional[torch.Tensor] = None, *, values: bool = True) -> torch.Tensor:
    """Validate shapes and (values=True) values; return `visible` as bool [Q, K]. Raises ValueError with
    the fix. values=False: the caller checks the values itself (as `rows.row_summary` does, block by block)."""
    if not isinstance(probs, torch.Tensor) or probs.dim() < 2:
        raise ValueError(f"probs must be a tensor [..., Q, K], got {getattr(probs, 'shape', type(probs))}")
    Q, K = probs.shape[-2:]
    if values:
        check_finite(probs, "probs", "check the model's attention (fully masked rows?)")
    if x is not None:
        if x.dim() < 2 or x.shape[-2] != K:
            raise ValueError(f"x must be [..., K={K}, D] to match probs [..., Q, K]; got {tuple(x.shape)}")
        xl, pl = tuple(x.shape[:-2]), tuple(probs.shape[:-2])
        if len(xl) > len(pl):
            raise ValueError("x has more leading dims than probs")
        if any(d not in (1, p) for d, p in zip(reversed(xl), reversed(pl))):   # (torch.broadcast_shapes: ms)
            raise ValueError(f"leading dims of x {xl} do not broadcast to those of probs {pl}")
        if values:
            check_finite(x, "x")
    if visible is None:
        return torch.ones(Q, K, dtype=torch.bool, device=probs.device)
    if visible.shape != (Q, K):
        raise ValueError(f"visible must be bool [Q={Q}, K={K}], got {tuple(visible.shape)}")
    return visible.to(device=probs.device, dtype=torch.bool)


def check_finite(t: torch.Tensor, name: str, hint: str = "") -> None:
    """ValueError naming `name` and the first position of a NaN or an infinity in t (one reduction when
    all is finite: the sum of a tensor with a NaN or an inf is not finite)."""
    if bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all()):
        return
    bad = (~torch.isfinite(t)).nonzero()[0].tolist()
    what = "NaN" if bool(torch.isnan(t[tuple(bad)])) else "an infinity"
    raise ValueError(f"{name} has {what} at position {tuple(bad)}" + (f": {hint}" if hint else ""))


def check_ns(ns: Iterable[int], K: int) -> list[int]:
    """Sorted distinct top-N sizes, checked: whole numbers, 1 <= N < K (a ValueError says which)."""
    ns = list(ns)
    bad = [n for n in ns if isinstance(n, bool) or not float(n).is_integer()]
    if bad:
        raise ValueError(f"N must be a whole number of tokens, got {bad[0]!r}")
    ns = sorted({int(n) for n in ns})
    if not ns:
        raise ValueError("need at least one N")
    if ns[0] < 1:
        raise ValueError(f"N must be >= 1, got {ns[0]}")
    if ns[-1] >= K:
        raise ValueError(f"N must be < L (the number of keys, {K}): got N={ns[-1]}; "
                         "choose a smaller top-N or a longer window")
    return ns


def check_stats(stats: Iterable[str], choices: Sequence[str]) -> list[str]:
    """The stats asked for, as a list, checked against `choices` (a ValueError names the unknown ones)."""
    stats = list(stats)
    bad = set(stats) - set(choices)
    if bad:
        raise ValueError(f"unknown stats {sorted(bad)}; choose from {choices}")
    return stats


# --------------------------------------------------------------------------------------- chunking

def flatten_heads(probs: torch.Tensor, x: Optional[torch.Tensor]):
    """probs -> [B, Q, K]; x -> [Bx, K, D] plus xmap long [B] (which x serves each flattened row)."""
    lead = probs.shape[:-2]
    P = probs.reshape(-1, *probs.shape[-2:])
    if x is None:
        return lead, P, None, None
    xlead = (1,) * (len(lead) - len(x.shape[:-2])) + tuple(x.shape[:-2])
    X = x.reshape(-1, *x.shape[-2:])
    xmap = (
        torch.arange(X.shape[0]).reshape(xlead).expand(lead).reshape(-1) if lead else torch.zeros(1, dtype=torch.long)
    )
    return lead, P, X, xmap


def blocks(B: int, Q: int, K: int, chunk: int) -> Iterator[tuple[slice, slice]]:
    """(heads, rows) slices with heads * rows * K <= chunk (at least one row), in the order of the
    flattened [B, Q] rows (concatenating per-block results gives them in order)."""
    if Q * K <= chunk:
        nb = max(1, chunk // (Q * K))
        for b0 in range(0, B, nb):
            yield slice(b0, min(B, b0 + nb)), slice(0, Q)
    else:
        nq = max(1, chunk // K)
        for b0 in range(B):
            for q0 in range(0, Q, nq):
                yield slice(b0, b0 + 1), slice(q0, min(Q, q0 + nq))


def row_lengths(vis: torch.Tensor) -> torch.Tensor:
    """The visible keys of each row of vis bool [..., Q, K]: long [..., Q] (a byte sum: half the time of a bool sum)."""
    return vis.view(torch.uint8).sum(-1, dtype=torch.int32).long()


def last_keys(vis: torch.Tensor, last: Optional[torch.Tensor] = None) -> Optional[list[int]]:
    """Each row's last visible key + 1 (`last_visible`, if the caller has it), for vis bool [Q, K] whose rows see
    more keys as they go (causal rows: non-decreasing, the first below K); None otherwise (no keys to leave out)."""
    last = (last_visible(vis) if last is None else last).cpu()
    if len(last) < 2 or int(last[0]) >= vis.shape[-1] or not bool((last[1:] >= last[:-1]).all()):
        return None
    return last.tolist()


def span_blocks(B: int, Q: int, K: int, chunk: int, last: Optional[list[int]]) -> Iterator[tuple[slice, slice, int]]:
    """`blocks`, each with hi: the keys its rows see all lie below hi (`last_keys`; K when last is None). When
    a head's rows are split, causal rows (`last` given) are cut so that rows * hi <= chunk: early rows see
    few keys, so a block holds more of them, and the keys past hi (invisible to every row of the block) are
    left out of its work (about half of them at long L)."""
    if last is None or Q * K <= chunk:
        for bs, qs in blocks(B, Q, K, chunk):
            yield bs, qs, K
        return
    starts = []
    q0 = 0
    while q0 < Q:
        q1 = bisect.bisect_right(range(q0 + 1, Q + 1), chunk, key=lambda q: (q - q0) * last[q - 1]) + q0
        q1 = max(q1, q0 + 1)
        starts.append((q0, q1))
        q0 = q1
    for b0 in range(B):
        for q0, q1 in starts:
            yield slice(b0, b0 + 1), slice(q0, q1), max(1, last[q1 - 1])


def key_spans(vis: torch.Tensor, pieces: int = 8) -> list[tuple[slice, int]]:
    """(rows, hi) spans of a block's rows, vis bool [q, K]: hi = the last key any of those rows sees, + 1, so that
    the keys past it (invisible to all of them) can be left out. Causal rows (the visible keys grow with the row)
    are cut into `pieces` spans (about half the keys left out); other visibility is one span."""
    q, K = vis.shape
    last = last_visible(vis)
    if q >= 2 * pieces and bool((last[1:] >= last[:-1]).all()) and int(last[0]) < K:
        cuts = [round(i * q / pieces) for i in range(pieces + 1)]
        return [(slice(a, b), int(last[b - 1])) for a, b in zip(cuts, cuts[1:])]
    return [(slice(0, q), int(last.max()) if q else K)]


def sort_keys(a: torch.Tensor, vis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """order, rank [b, q, K]: keys by weight descending (visible first, ties -> lower index)."""
    key = a.masked_fill(~vis, float("-inf"))
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(a.shape[-1], device=a.device).expand_as(order))
    return order, rank


def sort_top_keys(a: torch.Tensor, vis: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `sort_keys` for the first k positions only: order [b, q, k] (same keys, same order as the full
    stable sort) and rank [b, q, K] (exact below k, K elsewhere). O(K) per row instead of O(K log K)."""
    key = a.masked_fill(~vis, float("-inf"))
    K = key.shape[-1]
    tau = torch.topk(key, k, dim=-1, sorted=False).values.amin(-1, keepdim=True)  # k-th largest
    gt = key > tau
    need = k - gt.sum(-1, keepdim=True)  # ties at tau to take, lowest index first
    eq = key == tau
    sel = gt | (eq & (torch.cumsum(eq, -1) <= need))
    idx = sel.nonzero()[:, -1].view(*key.shape[:-1], k)  # selected keys, ascending index
    vals = key.gather(-1, idx)
    perm = torch.sort(vals, dim=-1, descending=True, stable=True).indices
    order = idx.gather(-1, perm)
    rank = torch.full_like(key, K, dtype=torch.long).scatter_(
        -1, order, torch.arange(k, device=a.device).expand_as(order)
    )
    return order, rank


def sort_rows(probs: torch.Tensor, visible: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, rank) [..., Q, K]: keys of each row by weight, descending, visible keys first, ties broken
    by the lower key index; `rank[..., t, i]` is the position of key i in row t's order."""
    vis = check_inputs(probs, None, visible)
    return sort_keys(probs, vis)


def top_n(probs: torch.Tensor, n: int, visible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Indices [..., Q, n] of the n largest visible weights of each row (ties -> lower index)."""
    vis = check_inputs(probs, None, visible)
    check_ns([n], probs.shape[-1] + 1)
    return sort_keys(probs, vis)[0][..., :n]


def context_vector(
    probs: torch.Tensor, x: torch.Tensor, n: int, visible: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Paper Eq. 6: `s = sum_{i in I_N} a_i x_i` for every row -> [..., Q, D] float64."""
    vis = check_inputs(probs, x, visible)
    check_ns([n], probs.shape[-1] + 1)
    _, rank = sort_keys(probs, vis)
    sel = (rank < n) & vis
    return torch.matmul((probs.double() * sel), x.double())


def cpu_kernels(t: torch.Tensor):
    """`normalization.kernels.metrics` when they serve tensors like t (CPU, `FUSED`), else None (torch operations)."""
    if FUSED and t.device.type == "cpu":
        from attnlab.normalization.kernels import metrics as kernels

        return kernels
    return None


#: Alg. 5 and Theorem 2's scan run as batched tiles off the CPU only (on CPU their step loops on cache-sized tensors are
#: 3-4x faster, kernels or not); True: the tiles on CPU too (tests: the GPU's code and its operator counts, here)
TILES_ON_CPU = False


def batched(t: torch.Tensor) -> bool:
    """Whether Alg. 5 and Theorem 2's scan run as batched tiles for tensors like t (`TILES_ON_CPU`)."""
    return t.device.type != "cpu" or TILES_ON_CPU


def tile_elements(budget: dict, t: torch.Tensor) -> int:
    """The elements of one batched tile on t's device: budget["cpu"] on the CPU (a tile that fits the cache),
    budget["other"] elsewhere (a GPU: as large as memory allows, few launches)."""
    return budget["cpu" if t.device.type == "cpu" else "other"]


def top_order(a: torch.Tensor, vis: torch.Tensor, k: int) -> torch.Tensor:
    """order [b, q, k]: the first k keys of each row by weight, descending, ties broken by the lower key
    index, invisible keys last (the first k of `sort_keys`). On CPU (`FUSED`) a full sort (k >= K - 1) is
    `kernels.sorted_keys`; for k <= SMALL_N one scan per row
    (`kernels.top_k`, when `FUSED`; insertion loses to torch's partial sort for larger k); else one
    `topk`, and rows where two of the first k + 1 weights are equal (where the tie rule decides) are
    redone with the stable `sort_top_keys`."""
    K = a.shape[-1]
    kernels = cpu_kernels(a)
    if k >= K - 1:                                         # a full sort: the kernels' (the same order), else torch's
        if kernels is not None and k > 0:
            return kernels.sorted_keys(a, None if bool(vis.all()) else vis, k).long()
        return sort_keys(a, vis)[0][..., :k]
    if kernels is not None and k <= SMALL_N:
        return kernels.top_k(a, None if bool(vis.all()) else vis, k)
    w = a if bool(vis.all()) else a.masked_fill(~vis, float("-inf"))
    vals, order = torch.topk(w, k + 1, dim=-1)
    tie = ((vals[..., 1:] == vals[..., :-1]) & (vals[..., 1:] > float("-inf"))).any(-1)  # [b, q]
    if bool(tie.any()):
        bb, tt = tie.nonzero(as_tuple=True)
        order[bb, tt, :k] = sort_top_keys(a[bb, tt], vis[tt], k)[0]
    return order[..., :k]


def root_sum(
    rows: "RowBlock",
    w: Optional[torch.Tensor],
    c0: torch.Tensor,
    g,
    sign: float = 1.0,
    drop: Optional[torch.Tensor] = None,
    s2_coef=0.0,
    table: Optional[tuple] = None,
    lam: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """sum over the visible keys (but the positions `drop` [b, q, n]) of the distances
    sqrt(c + sign * a_i (a_i ||x_i||^2 - 2 g w_i)), c = c0 + s2_coef * sum_j a_j^2 ||x_j||^2: [b, q]
    (a_i: the row's weights, or `lam` [b, q, K] in their place, e.g. a_i + N/(L-1) for the printed forms of E)
    float64, for w [b, q, K] (x_i.s or x_i.o, one matrix product; None on CPU with table = (H, inv) of
    `_far_tables`: w_i = x_i.s for s the dropped keys' sum, from H), c0 [b, q, 1], g and s2_coef numbers or
    [q, 1]. Torch also takes many N at once: w [b, q, n or 1, K] (x_i.s of each N), c0 [b, q, n, 1], g [q, n, 1],
    lam [b, q, n, K], `drop` a bool mask [b, q, n, K], giving [b, q, n]. The squares are formed in float64 by
    default (the cancellation happens there), their roots in float32 (~1e-7 relative; float64 roots are 4x slower
    on CPU), the sums in float64. On CPU one fused pass per row (`normalization.kernels.metrics`, when `FUSED`);
    elsewhere torch, a pass per operation."""
    kernels = cpu_kernels(rows.a)
    if kernels is not None:
        c0, g, s2_coef = (v.squeeze(-1) if torch.is_tensor(v) else v for v in (c0, g, s2_coef))
        return kernels.root_sums(rows.p if lam is None else lam, rows.xn2, w, c0, g, sign,
                                 rows.vis if rows.masked else None, drop, s2_coef=s2_coef, table=table)
    a = rows.a if lam is None else lam
    if w.dim() == 4 and a.dim() == 3:                                   # [b, q, n, K]: many N at once
        a = a.unsqueeze(2)
    extra = (1,) * (a.dim() - 3)
    ax = a * rows.xn2.view(rows.xn2.shape[0], 1, *extra, -1)           # a_i ||x_i||^2
    c = c0 + s2_coef * (a * ax).sum(-1, keepdim=True) if torch.is_tensor(s2_coef) or s2_coef else c0
    sq = torch.addcmul(c, a, torch.sub(ax, w * g, alpha=2), value=sign).float()
    if drop is not None:
        sq = sq.masked_fill_(drop, 0.0) if drop.dtype == torch.bool else sq.scatter_(-1, drop, 0.0)
    if rows.masked:
        sq.masked_fill_(~rows.vis.view(rows.vis.shape[0], *extra, -1), 0.0)
    return sq.clamp_min_(0).sqrt_().sum(-1).double()


class RowBlock:
    """One block of attention rows (b heads x q queries x K keys), prepared once for every N.

    p [b, q, K] the weights as given, a the same in `dtype`, 0 on invisible keys; order [b, q, k] the
    top k keys of each row (`top_order`), or the given `order` (any order of the visible keys); X [b, K, D] the
    vectors of each head, from the distinct Xu
    [u, K, D] (one per head for value vectors, one per layer for hidden states; inv [b] says which), so
    Gram matrices are made once per distinct x; xn2 [b, K] = ||x_i||^2; n [q] visible keys per row
    (`lengths`, if the caller has them) and Lt the same in `dtype`; masked: some key is invisible to
    some row; prefix: every row sees the keys 0..n_t - 1 (given, or found when first asked).
    """

    def __init__(self, probs, vis, Xu, inv, k: int, dtype, lengths=None, prefix=None, order=None):
        self.order = top_order(probs, vis, k) if order is None else order[..., :k].long()
        self.p = probs.contiguous()                                      # (the kernels read it so)
        self.n = row_lengths(vis) if lengths is None else lengths
        self.masked = bool((self.n < vis.shape[-1]).any())
        self._prefix = prefix
        self.vis = vis
        self.a = probs.to(dtype) * vis if self.masked else probs.to(dtype)
        self.Xu, self.inv = Xu, inv
        self.X = Xu[inv]
        self.XT = self.X.transpose(1, 2)  # [b, D, K]
        self.xn2 = (self.X * self.X).sum(-1)
        self.Lt = self.n.to(dtype)
        b = probs.shape[0]
        self.bidx = torch.arange(b, device=probs.device).view(b, 1, 1)

    @property
    def prefix(self) -> bool:
        if self._prefix is None:
            self._prefix = prefix_lengths(self.vis) is not None
        return self._prefix

    def top_sum(self, lo: int, hi: int) -> torch.Tensor:
        """sum of y_j = a_j x_j over the keys at positions lo..hi-1 of each row's order: [b, q, D]."""
        b, q, K = self.a.shape
        if hi - lo > 8:  # many keys: one masked product
            w = torch.zeros_like(self.a).scatter_(-1, self.order[..., lo:hi], 1.0).mul_(self.a)
            return torch.bmm(w, self.X)
        j = self.order[..., lo:hi]
        xj = self.Xu[self.inv.view(b, 1, 1), j]                          # [b, q, hi - lo, D]
        return (self.a.gather(-1, j).unsqueeze(-1) * xj).sum(-2)

    def selected(self, N: int) -> torch.Tensor:
        """bool [b, q, K]: the top-N keys of each row."""
        return torch.zeros(self.a.shape, dtype=torch.bool, device=self.a.device).scatter_(-1, self.order[..., :N], True)


def unique_x(
    X: torch.Tensor, xmap: torch.Tensor, bs: slice, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """Distinct x of a heads block: Xu [u, K, D] in `dtype`, inv [b], and a hashable key."""
    uniq, inv = torch.unique(xmap[bs], return_inverse=True)
    return X[uniq.to(X.device)].to(dtype), inv.to(X.device), tuple(uniq.tolist())


def same_x(X: torch.Tensor, xmap: torch.Tensor) -> torch.Tensor:
    """xmap long [B] with each x of X [Bx, K, D] that equals an earlier one bit for bit (the value vectors of the
    query heads of one GQA group, repeated per head) mapped to that one, so that `unique_x` and the per-x tables
    made from it see one x. One pass over X's bytes (each x's bytes are its dict key)."""
    raw = X.detach().cpu().contiguous().view(torch.uint8).reshape(X.shape[0], -1)
    first: dict[bytes, int] = {}
    same = [first.setdefault(raw[i].numpy().tobytes(), i) for i in range(X.shape[0])]
    return torch.tensor(same, dtype=torch.long, device=xmap.device)[xmap]


def nan_rows(value: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    return value.masked_fill(~ok, float("nan"))


def prefix_lengths(vis: torch.Tensor, n: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """If every row's visible set is {0..n_t-1}, return n_t [q] (n: `row_lengths`, when the caller has it); else None.
    (A row's keys form a prefix when its last visible key + 1 is its number of visible keys.)"""
    n = row_lengths(vis) if n is None else n
    return n if bool(torch.equal(last_visible(vis), n)) else None


def visible_scores(scores: torch.Tensor, visible: Optional[torch.Tensor]) -> torch.Tensor:
    """bool [Q, K]: keys whose score is finite (and visible, if given). -inf masks a key; it must mask it
    in every head (one mask shared by the heads, as a model's causal or padding mask); NaN and +inf are
    errors that name their position."""
    if not isinstance(scores, torch.Tensor) or scores.dim() < 2:
        raise ValueError(f"scores must be a tensor [..., Q, K], got {getattr(scores, 'shape', type(scores))}")
    Q, K = scores.shape[-2:]
    if visible is not None and visible.shape != (Q, K):
        raise ValueError(f"visible must be bool [Q={Q}, K={K}], got {tuple(visible.shape)}")
    if bool(torch.isfinite(scores.sum())):                               # one reduction: no -inf, NaN or +inf
        vis = torch.ones(Q, K, dtype=torch.bool, device=scores.device)
        return vis if visible is None else visible.to(device=vis.device, dtype=torch.bool).clone()
    flat = scores.reshape(-1, Q, K)
    lo, hi = flat.amin(0), flat.amax(0)  # NaN propagates
    if torch.isnan(hi).any() or bool((hi == float("inf")).any()):
        bad = (torch.isnan(scores) | (scores == float("inf"))).nonzero()[0].tolist()
        raise ValueError(f"scores have NaN or +inf at position {tuple(bad)}: a masked key must be -inf")
    vis = lo > float("-inf")                                             # finite in every head
    mixed = (hi > float("-inf")) & ~vis                                  # masked in some heads only
    if bool(mixed.any()):
        q, k = mixed.nonzero()[0].tolist()
        raise ValueError(f"scores mask key {k} of row {q} (-inf) in some heads but not in others: per-head masks "
                         "are not supported; pass the heads with one shared mask")
    return vis if visible is None else vis & visible.to(device=vis.device, dtype=torch.bool)


def row_mean(values: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Mean over query rows ignoring skipped (NaN) rows; pass `dim` of the row axis."""
    return torch.nanmean(values, dim=dim)
