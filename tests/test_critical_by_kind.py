"""Critical N by layer kind (issue #48 item 3, `attnlab.tools.critical_by_kind`): captured one layer at a time from
one pass at the longest L, each (L, kind) row equals diagnose's pooled KS scan on a whole capture of the first L
tokens, the heads of that kind's layers pooled; the sliding kind's grid stops at its window."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.core.models import AttnModel
from attnlab.tools import diagnose as dg
from attnlab.tools.critical_by_kind import critical_by_kind, head_means, kind_grid
from tests.test_sliding_figures import mixed_gemma

W = 8          # the window of `kinds_model`


def kinds_model() -> AttnModel:
    """A seeded random Gemma 3 text model with 8 heads a layer (a pooled KS test of 16 heads can reject at 0.01),
    layers sliding (window 8), full, full, sliding."""
    return mixed_gemma(kinds=("sliding", "full", "full", "sliding"), window=W, heads=8, kv_heads=2, hidden=64,
                       positions=128, seed=1, name="tiny-gemma3-kinds")


def test_each_kind_pools_its_layers_heads_as_a_whole_capture_does():
    model = kinds_model()
    ids = torch.randint(3, 128, (96,), generator=torch.Generator().manual_seed(5))
    res = critical_by_kind(model, ids, lengths=(32, 96), max_rows=24)
    assert [(r["L"], r["kind"], r["n_layers"]) for r in res.rows] == [(32, "full", 2), (32, "sliding", 2),
                                                                      (96, "full", 2), (96, "sliding", 2)]
    assert all(r["critical_n_testable"] for r in res.rows)
    for r in res.rows:
        L = r["L"]
        trace = model.capture(ids[:L], keep=("probs", "v"))
        layers = [i for i, (k, _) in enumerate(model.layer_kinds) if k == r["kind"]]
        longest, ns = kind_grid(L, W if r["kind"] == "sliding" else None, dg.CRIT_MAX_FRAC, dg.CRIT_STEP_FRAC)
        rows = dg.row_sample(L, 24)
        d, e = [], []
        for li in layers:                # (the whole capture mixes kinds: each layer's own mask)
            vis = trace.visible(layer=li)
            dd, ee = head_means(trace.probs[li][:, rows], trace.v[li], vis[rows], ns)
            d.append(dd)
            e.append(ee)
        want = dg.pooled_critical_n(np.concatenate(d), np.concatenate(e), ns, longest, dg.ALPHA)
        assert r["longest_row"] == longest == (min(L, W) if r["kind"] == "sliding" else L)
        assert r["n_pooled_heads"] == 8 * len(layers) and vis.shape == (L, L)
        for k, v in want.items():
            assert r[k] == pytest.approx(v, nan_ok=True), (L, r["kind"], k)
    assert max(r["critical_n_max"] for r in res.rows if r["kind"] == "sliding") < W


def test_refuses_an_encoder_and_lengths_past_the_window():
    model = mixed_gemma()
    ids = torch.randint(3, 128, (32,), generator=torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match=r"lengths must be in \[16, 32\]"):
        critical_by_kind(model, ids, lengths=(16, 64))


def test_the_chapters_sentences_and_table_read_every_number_from_the_result():
    """Chapters 3 and 6: each number the prose and table print is a row's, and another Result gives other text."""
    from attnlab.core.result import Result
    from attnlab.views import layer_kinds as kind_views

    model = kinds_model()
    ids = torch.randint(3, 128, (96,), generator=torch.Generator().manual_seed(5))
    res = critical_by_kind(model, ids, lengths=(32, 96), max_rows=24)
    prose, table = kind_views.critical_prose(res).data, kind_views.critical_table(res).data
    by = {(r["L"], r["kind"]): r for r in res.rows}
    full96, full32 = by[(96, "full")], by[(32, "full")]
    assert f"{full96['critical_n_frac']:.3f} L_t" in prose and f"{int(full96['critical_n'])} = " in table
    assert f"not found up to N = {full32['critical_n_max']}" in prose and "none up to 16" in table
    assert "at most 0.06 of L_t at 0 of 2 lengths" in prose                  # 40 / 96 and censored: neither
    assert "the sliding layers meet it at L = 32, 96 only" in prose           # N = 1 of 8 keys: 1 <= 0.06 L
    assert "tiny-gemma3-kinds" in prose and "24 rows a head" in prose and "no BOS token, first 96 tokens" in prose
    moved = Result(res.name, [dict(r, critical_n=3.0, critical_n_frac=3 / r["longest_row"], critical_n_censored=False)
                              for r in res.rows], res.provenance)
    assert kind_views.critical_prose(moved).data != prose and kind_views.critical_table(moved).data != table
    assert "at most 0.06 of L_t at 1 of 2 lengths" in kind_views.critical_prose(moved).data     # 3 / 96, not 3 / 32
