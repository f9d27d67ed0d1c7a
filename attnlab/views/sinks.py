"""Views for the attention-sink section of chapter 7: the cached sink Results of both offline models
(`tools.sinks`), the sink table per model (share on the first token by layer, against L), the headline
claims with and without the sink heads, and the sentences that say which way they move, computed from the rows.
Views only: the science is in `attnlab.tools.sinks`."""
from __future__ import annotations

from typing import Optional

import numpy as np

from attnlab.book import markup, models, running
from attnlab.core.result import Result
from attnlab.figures import FIGURES, Inputs
from attnlab.normalization.claims import SLOPE_TOL
from attnlab.normalization.metrics.critical_n import fewest_heads
from attnlab.normalization.paper import CRITICAL_FRAC, KS_ALPHA, SEPARABILITY_BAND
from attnlab.tools import sinks

MODELS = models.OFFLINE_MODELS                   # the model table's offline models of the book
SHARE_LENGTHS = (64, 128, 256, 512, 1024)      # cut at the model's positions (MiniLM: 512)
CLAIM_MAX_LENGTH = sinks.CLAIM_MAX_LENGTH      # the claims at the window set's lengths (`windows.BOOK_LENGTHS`)
SWAP_LENGTH = 512                              # the swapped normalizers' sink shares, one length
SWAPPED = ("softpick", "sigmoid")              # the normalizers swapped in (`swapped_shares`)
WINDOW = sinks.BOOK_WINDOW                     # the text window: the first tokens of War and Peace


def model_inputs(name: str, inp: Optional[Inputs] = None, device: str = "cpu") -> Inputs:
    """`inp` when it holds model `name` (the chapter's, loaded once), else `running.inputs(name, device)`."""
    return inp if inp is not None and inp.model.name == name else running.inputs(name, device)


def _sharing(inp: Inputs, max_length: Optional[int]) -> Inputs:
    """Inputs of the same model and text (loaded once: `Workspace.with_window`) with another `max_length`."""
    inp.model, inp.corpus                          # loaded here, shared by the sibling
    return inp.with_window(max_length=max_length)


def _text(inp: Inputs) -> dict:
    return sinks.window_text(inp.corpus)


def shares(inp: Inputs, normalizer: Optional[str] = None) -> Result:
    """The "sink_shares" Result of `inp`'s model on W&P #1 (cached): L in SHARE_LENGTHS up to its positions;
    with `normalizer` swapped into every layer, at SWAP_LENGTH only."""
    inp = _sharing(inp, None)
    lengths = [L for L in SHARE_LENGTHS if L <= inp.window_length] if normalizer is None else [SWAP_LENGTH]
    ids = inp.ids(max(lengths))
    key = {"window": WINDOW, "lengths": lengths, "normalizer": normalizer, "device": inp.device}
    return running.cached_result("sink_shares", key, lambda: sinks.sink_shares(inp.model, ids, lengths=lengths,
                                                                             normalizer=normalizer,
                                                                             text=_text(inp)),
                              model=inp.model, text_sha256=inp.corpus.sha256)


def swapped_shares(inp: Inputs) -> dict[str, Result]:
    """{normalizer: `shares` of `inp`'s model with it swapped into every layer} for SWAPPED (`swap_table`)."""
    return {n: shares(inp, n) for n in SWAPPED}


def claims(inp: Inputs) -> Result:
    """The "sink_claims" Result of `inp`'s model on W&P #1, L up to CLAIM_MAX_LENGTH (cached); Fig. 3 from the
    per-head rows of the book's cached fig3 Result of that window and length (`running.figure_results`)."""
    inp = _sharing(inp, CLAIM_MAX_LENGTH)
    fig3 = running.figure_results(["fig3"], inp)["fig3"]
    lengths = [n for n in SHARE_LENGTHS if n <= inp.window_length]
    key = {"window": WINDOW, "lengths": lengths, "fig3_version": FIGURES["fig3"].version, "device": inp.device}
    return running.cached_result("sink_claims", key, lambda: sinks.sink_claims(inp.model, inp.ids(), fig3=fig3,
                                                                             lengths=lengths, text=_text(inp)),
                              model=inp.model, text_sha256=inp.corpus.sha256)


def swap_table(native: Result, swapped: dict[str, Result]):
    """HTML: mean weight on the first token and sink heads at SWAP_LENGTH, the model's softmax (from `native`)
    against each swapped normalizer ({label: its "sink_shares" Result})."""
    rows = []
    for label, res in {"softmax (the model)": native, **swapped}.items():
        sel = res.select(L=SWAP_LENGTH)
        rows.append([label, f"{np.mean([r['first'] for r in sel]):.3f}", f"{np.max([r['first'] for r in sel]):.3f}",
                     f"{sum(r['sink'] for r in sel)} of {len(sel)}", f"{np.mean([r['repeated'] for r in sel]):.3f}"])
    p = native.provenance
    return markup.table(["normalizer", "first token: mean over heads", "largest head", "sink heads", "repeated tokens"],
                      rows, caption=f"{p['model']}, {WINDOW}, L = {SWAP_LENGTH}: weights as each normalizer gives "
                                    "them (not renormalized), swapped into every layer without retraining")


# ------------------------------------------------------------------------------------------ tables

def layer_table(res: Result) -> tuple[list[str], list[list]]:
    """(header, rows): mean over heads of the weight on the first token, one row per layer and one column per
    L; then the mean over all heads, the sink heads' count, the repeated-token share, their uniform baselines."""
    Ls = res.unique("L")
    header = ["layer"] + [f"L = {L}" for L in Ls]
    mean = {(L, layer): np.mean(res.column("first", L=L, layer=layer)) for L in Ls for layer in res.unique("layer")}
    rows = [[str(layer)] + [f"{mean[L, layer]:.2f}" for L in Ls] for layer in res.unique("layer")]
    rows.append(["<b>all heads</b>"] + [f"<b>{np.mean(res.column('first', L=L)):.2f}</b>" for L in Ls])
    rows.append(["first token, uniform weights"] + [f"{res.select(L=L)[0]['first_uniform']:.4f}" for L in Ls])
    rows.append(["sink heads (first >= 0.5)"] + [f"{sum(res.column('sink', L=L))} of {len(res.select(L=L))}"
                                                  for L in Ls])
    rows.append(["repeated tokens"] + [f"{np.mean(res.column('repeated', L=L)):.2f}" for L in Ls])
    rows.append(["repeated tokens, uniform weights"] + [f"{res.select(L=L)[0]['repeated_uniform']:.2f}" for L in Ls])
    if res.rows[0].get("sep") is not None:
        rows.append(["[SEP] (last token)"] + [f"{np.mean(res.column('sep', L=L)):.3f}" for L in Ls])
    return header, rows


def share_table(res: Result):
    """HTML: `layer_table` with a caption naming the model, the window and the definitions."""
    p = res.provenance
    first = "[CLS]" if not p["causal"] else "the text's first word piece; no BOS"
    return markup.table(*layer_table(res), caption=f"{p['model']} ({'causal' if p['causal'] else 'bidirectional'}), "
                      f"{WINDOW}: mean weight on the first token ({first}) per layer against L")


QUANTITIES = {"critical_frac": "critical N / L", "fig3_median_lo": "Fig. 3: median N_s/N, N >= 16 (lowest)",
              "fig3_median_hi": "Fig. 3: median N_s/N, N >= 16 (highest)", "fig4_slope": "Fig. 4: 1/T slope"}


def claims_rows(res: Result) -> list[list]:
    """One row per (quantity, L): the value for each subset of heads (count of heads in brackets; "n/a" where
    it was not measured: no heads, or too few for the KS test)."""
    out = []
    for q, label in QUANTITIES.items():
        for L in sorted({r["L"] for r in res.select(quantity=q)}):
            cells = []
            for s in sinks.SUBSETS:
                r = res.select(quantity=q, L=L, subset=s)[0]
                value = f"{r['value']:.3f}" if np.isfinite(r["value"]) else "n/a"
                cells.append(f"{value} ({r['n_heads']})")
            out.append([label, L, *cells])
    return out


def per_kind(res: Result) -> list[Result]:
    """[res] for a model whose layers are of one kind; for one with sliding-window layers (rows carrying
    `layer_kind`: `tools.sinks.sink_claims` measures each kind over its own heads), one Result per kind, its kind and
    window in its provenance, so that each table and summary is of one kind's heads."""
    kinds = res.unique("layer_kind")
    if len(kinds) <= 1:
        return [res]
    return [Result(name=res.name, rows=res.select(layer_kind=k),
                   provenance={**res.provenance, "layer_kind": k,
                               "sliding_window": res.select(layer_kind=k)[0].get("sliding_window")})
            for k in kinds]


def _title(res: Result) -> str:
    """'gemma3, sliding layers (w = 512), W&P #1' for one kind of a `per_kind` split; 'minilm, W&P #1'."""
    p = res.provenance
    kind = p.get("layer_kind")
    where = ("" if kind is None else f", {kind} layers" if not p.get("sliding_window") else
             f", {kind} layers (w = {p['sliding_window']})")
    return f"{p['model']}{where}, {WINDOW}"


def claims_table(res: Result):
    return markup.table(["quantity", "L", *sinks.SUBSETS], claims_rows(res),
                        caption=f"{_title(res)}: the claims on each subset of heads (number of heads; n/a: no "
                                f"heads, or for the critical N fewer than {fewest_heads(KS_ALPHA)}, with which the KS "
                                f"test cannot reject at alpha = {KS_ALPHA})")


# --------------------------------------------------------------------------------- the sentences

def _value(res: Result, q: str, subset: str, L=None) -> float:
    rows = res.select(quantity=q, subset=subset)
    L = max(r["L"] for r in rows) if L is None else L
    return next(r["value"] for r in rows if r["L"] == L)


def distance_to_paper(q: str, v: float) -> float:
    """How far a value is from what the paper reports: critical N / L above 0.06; Fig. 3's median outside
    [0.7, 0.85]; Fig. 4's slope from -1. (0 = the paper's value; NaN stays NaN.)"""
    lo, hi = SEPARABILITY_BAND
    if q == "critical_frac":
        return max(v - CRITICAL_FRAC, 0.0)
    if q.startswith("fig3"):
        return max(lo - v, v - hi, 0.0)
    return max(abs(v + 1) - SLOPE_TOL, 0.0)


def verdicts(res: Result) -> list[dict]:
    """Per claim: the values with all heads and without the sink heads (critical N: every L; the others: the
    longest L), the heads left without them, whether removing the sink heads moves it toward the paper's number
    ("toward", "away", "unchanged": as far from it, as two values inside Fig. 3's band are; "untested" where a value
    is not measured: a critical N on fewer heads than the KS test needs to reject at all), whether the claim holds
    with every head ("holds": at the paper's number already) and whether removing them reaches it ("explains": the
    claim holds without them but not with them)."""
    out = []
    Ls = sorted({r["L"] for r in res.select(quantity="critical_frac")})
    groups = [("critical N / L", "critical_frac", Ls), ("Fig. 3's band", "fig3_median_lo", None),
              ("Fig. 3's band", "fig3_median_hi", None), ("Fig. 4's 1/T slope", "fig4_slope", None)]
    for label, q, lengths in groups:
        if not res.select(quantity=q):
            continue
        for L in (lengths or [None]):
            a, w = _value(res, q, "all heads", L), _value(res, q, "without sink heads", L)
            da, dw = distance_to_paper(q, a), distance_to_paper(q, w)
            move = ("untested" if not (np.isfinite(a) and np.isfinite(w)) else   # as far from the paper's number:
                    "unchanged" if abs(w - a) < 1e-9 or dw == da else               # both inside Fig. 3's band
                    "toward" if dw < da else "away")
            L = L or max(r["L"] for r in res.select(quantity=q))
            out.append({"claim": label, "quantity": q, "L": L, "all": a, "without": w, "move": move,
                        "heads_without": res.select(quantity=q, subset="without sink heads", L=L)[0]["n_heads"],
                        "holds": bool(da == 0), "explains": bool(move != "untested" and da > 0 and dw == 0)})
    return out


MOVES = {"toward": "moves toward", "away": "moves away from", "unchanged": "does not move relative to",
         "untested": "leaves too few heads to test against"}


def _explained(rows: list[dict]) -> str:
    """Over the rows measured where the claim misses with every head: 'yes' when removing the sink heads reaches
    the paper's number at each, else 'no'; 'not needed' when the claim holds with every head wherever measured;
    'cannot tell' when no row is measured."""
    tested = [r for r in rows if r["move"] != "untested"]
    missed = [r for r in tested if not r["holds"]]
    if not tested:
        return "cannot tell"
    if not missed:
        return "not needed (it holds with every head)"
    return "yes" if all(r["explains"] for r in missed) else "no"


def _few(rows: list[dict]) -> str:
    """The caveat of critical-N rows not measured: too few heads left for the KS test."""
    k = fewest_heads(KS_ALPHA)
    few = sorted({r["heads_without"] for r in rows if r["move"] == "untested" and r["heads_without"] < k})
    if not few:
        return ""
    n = str(few[0]) if few[0] == few[-1] else f"{few[0]}-{few[-1]}"
    return (f" (without the sink heads {n} heads are left: with fewer than {k} the KS test "
            f"cannot reject at alpha = {KS_ALPHA}, so every N would pass)")


def _num(x: float) -> str:
    return f"{x:.2f}" if np.isfinite(x) else "n/a"


def summary(res: Result) -> str:
    """One sentence per claim, from `verdicts`: the values with and without the sink heads, which way removing
    them moves the claim relative to the paper's number, and whether that reaches it (sinks explain it)."""
    v = verdicts(res)
    lines = []
    crit = [r for r in v if r["quantity"] == "critical_frac"]
    if crit:
        per_L = "; ".join(f"L = {r['L']}: {_num(r['all'])} -> {_num(r['without'])}" for r in crit)
        counts = {m: sum(r["move"] == m for r in crit) for m in MOVES}
        moved = ", ".join(f"{MOVES[m]} the paper's {CRITICAL_FRAC} L at {n} of {len(crit)} lengths"
                          for m, n in counts.items() if n)
        lines.append(f"critical N / L, all heads -> without the sink heads: {per_L}. Removing the sink heads "
                     f"{moved}{_few(crit)}; sinks explain it: {_explained(crit)}")
    band = [r for r in v if r["quantity"].startswith("fig3")]
    if band:
        moves = sorted({r["move"] for r in band})
        lo, hi = band[0], band[1]
        lines.append(f"Fig. 3 (L = {lo['L']}): median N_s/N {_num(lo['all'])}..{_num(hi['all'])} with all heads, "
                     f"{_num(lo['without'])}..{_num(hi['without'])} without the sink heads: removing them "
                     f"{' / '.join(MOVES[m] for m in moves)} the paper's band {SEPARABILITY_BAND[0]}-"
                     f"{SEPARABILITY_BAND[1]}; sinks explain it: {_explained(band)}")
    slope = [r for r in v if r["quantity"] == "fig4_slope"]
    if slope:
        r = slope[0]
        lines.append(f"Fig. 4 (L = {r['L']}): log-log slope {_num(r['all'])} with all heads, {_num(r['without'])} "
                     f"without the sink heads: removing them {MOVES[r['move']]} the paper's -1; sinks explain it: "
                     f"{_explained(slope)}")
    return f"<b>{_title(res)}</b><ul>" + "".join(f"<li>{s}</li>" for s in lines) + "</ul>"
