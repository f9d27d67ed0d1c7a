"""The one tolerance rule of every inequality a claim tests (`core.verdicts.holds_le`): bounds met with equality,
values near zero, thresholds met exactly, and the same verdict whatever the thread count."""
import math

import numpy as np
import pytest
import torch

from attnlab.core.capture import Trace
from attnlab.core.result import Result
from attnlab.core.util import threads
from attnlab.normalization import experiments as ex
from attnlab.normalization.claims import paper1_claims


def test_holds_le_is_relative_with_an_absolute_part_from_the_scale():
    from attnlab.core.verdicts import RTOL, holds_le, within

    assert holds_le(1.0, 1.0) and holds_le(0.0, 0.0) and holds_le(-3.0, -3.0)
    assert holds_le(1 + RTOL / 2, 1.0) and not holds_le(1 + 2 * RTOL, 1.0)
    # near zero: a side of 1e-4 formed from terms of size 1.5 keeps the tolerance of its terms, only with the scale
    assert holds_le(1e-4 + 1e-7, 1e-4, scale=1.5) and not holds_le(1e-4 + 1e-7, 1e-4)
    assert not holds_le(1e-4 + 1e-5, 1e-4, scale=1.5)                    # a real excess of the scale's order fails
    assert not holds_le(math.nan, 1.0) and not holds_le(0.0, math.nan)
    assert not holds_le(math.inf, 1e300) and holds_le(1e300, math.inf) and holds_le(-math.inf, 0.0)
    t = holds_le(torch.tensor([1.0, 1 + 1e-5, math.nan]), torch.tensor(1.0, dtype=torch.float64))
    assert t.tolist() == [True, False, False]
    assert holds_le(np.array([0.5, 2.0]), 1.0).tolist() == [True, False]
    assert within(0.7, 0.7, 0.85) and within(0.85 * (1 + RTOL / 2), 0.7, 0.85) and not within(0.69, 0.7, 0.85)


def _two_key_trace(a0: float, a1: float, x0: torch.Tensor, x1: torch.Tensor):
    """A causal trace of one head and two tokens whose row 1 has weights (a0, a1) (float32) on keys x0, x1."""
    probs = torch.tensor([[1.0, 0.0], [a0, a1]], dtype=torch.float32).view(1, 1, 2, 2)
    v = torch.stack([x0, x1]).float().view(1, 1, 2, -1)
    return Trace("two-keys", torch.tensor([0, 1]), [0], [0], causal=True, scaling=1.0, probs=probs, v=v)


X = torch.randn(64, generator=torch.Generator().manual_seed(3)) * 12


@pytest.mark.parametrize("a0, a1, x1", [
    # SmolLM2, WikiText-2 window #4, layer 12 head 6, row 1: float32 weights summing to 1 - 3e-8, x0 = x1; d_max[B]
    # = R (2 abar - 1) - R (1 - sum a) is ~7e-5, so the weights' rounding moves it by 7e-4 of itself
    (0.4999786913394928, 0.5000212788581848, X),
    # weights summing to 1 exactly, 2^-20 apart: d~ = d_max[B] = 2^-20 ||x|| in exact arithmetic; d~ formed from squared
    # norms of size ||x||^2 ~ 1e4 comes out 2.5e-5 of itself above the bound
    (0.5 - 2 ** -21, 0.5 + 2 ** -21, X),
    # x1 one float32 unit away from x0 (the SmolLM2 rows: ||x0 - x1|| ~ 2.5e-7)
    (0.4999786913394928, 0.5000212788581848, X * (1 + 2 ** -23)),
])
def test_theorem1_B_holds_at_equality_for_N_1_with_x0_equal_x1(a0, a1, x1):
    p = ex.resolve_protocol(False, {})
    (row,) = ex.distance_rows(_two_key_trace(a0, a1, X, x1), p, [1], 2)
    assert row["n_rows"] == 1
    assert row["holds_B"] == 1.0 and row["holds_R"] == 1.0 and row["holds_a"] == 1.0


def test_a_threshold_met_exactly_holds():
    """|d~(100) - d~(20)| / d~(20) = (0.375 - 0.3) / 0.3 = 0.25 is 0.25000000000000006 in floats: the plateau
    claim (<= 0.25) holds."""
    rows = [dict(window=0, layer=0, head=0, L=128, N=N, dtilde_b=d, dmax_B=1.0, dmax_R=1.0, n_rows=10, holds_B=1.0,
                 holds_R=1.0, holds_a=1.0)
            for N, d in ((1, 0.1), (20, 0.3), (100, 0.375))]
    claims = {r["id"]: r for r in paper1_claims({"fig2b": Result("fig2b", rows, {"model": "m"})})}
    assert claims["p1-fig2b-plateau"]["value"] == pytest.approx(0.25)
    assert claims["p1-fig2b-plateau"]["verdict"] == "holds"


@pytest.mark.usefixtures("one_thread")
def test_same_holds_columns_with_one_and_two_threads_on_a_real_capture(tiny):
    """tiny-gpt2 (random weights: near-uniform rows), every head's x1 set to its x0: the N = 1 rows at t = 1 meet
    Theorem 1 [B] with equality. Every "holds" column is 1 there and the same with 1 and 2 torch threads."""
    ids = torch.randint(0, 1000, (48,), generator=torch.Generator().manual_seed(0))
    trace = ex.Captures(tiny, ids, ["probs", "v"]).get(48)
    trace.v[..., 1, :] = trace.v[..., 0, :]
    p = ex.resolve_protocol(False, {})
    by_threads = {}
    for n in (1, 2):
        with threads(n):
            st = ex.distance_table(trace, p, [1, 5])
            by_threads[n] = ex.distance_rows(trace, p, [1, 5], 48, st=st)
    for n, rows in by_threads.items():
        assert all(r["holds_B"] == 1.0 and r["holds_R"] == 1.0 and r["holds_a"] == 1.0 for r in rows if r["N"] == 1), n
    keys = ("holds_B", "holds_R", "holds_a")
    assert [[r[k] for k in keys] for r in by_threads[1]] == [[r[k] for k in keys] for r in by_threads[2]]
