"""Token sample complexity of a pretrained encoder's self-attention, per layer and per head (the authors'
BERT protocol of arXiv 2512.10656 on attnlab's model and text; rows as in
`attnlab.sample_complexity.experiments`)."""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.result import Result, provenance
from attnlab.sample_complexity import montecarlo as mc
from attnlab.sample_complexity import theory
from attnlab.sample_complexity.protocol import (
    ERROR_BARS,
    PAPER,
    as_dtype,
    check_device,
    fit_label,
    fit_row,
    grid_values,
    preset_config,
)

# ==================================================================================================
# 4. a real pretrained encoder
# ==================================================================================================

REAL_PRESETS = {
    # the authors' BERT run used n = geomspace(64, 384, 10), k = 500 on bert-base-uncased
    "paper": dict(n_values=tuple(np.geomspace(64, 384, 10).astype(int)), k=500),
    "default": dict(n_values=(64, 96, 144, 216, 324), k=32),
    "quick": dict(n_values=(8, 16, 32), k=4),
}


def real_params(model, quick: bool = False) -> dict:
    """`real_encoder`'s parameters spelled out (the key of its Result, `attnlab.results`): the default preset's
    grid (quick: the quick one's) on the first min(model's positions, 512) tokens of WikiText-2 (quick: 64).
    `real_encoder(model, device=..., **real_params(model, quick))` is `real_encoder(model, quick=quick, ...)`
    for an encoder of at most 512 positions (MiniLM's)."""
    grid = dict(REAL_PRESETS["quick"], preset="quick") if quick else dict(REAL_PRESETS["default"])
    return dict(grid, L=min(model.max_positions, 64 if quick else 512), offset=0, seed=0, corpus="wikitext2")


def _self_attention_module(hf, layer: int):
    """``encoder.layer[layer].attention.self`` of a BERT-family model (bare or with a head)."""
    for root in (hf, getattr(hf, "base_model", None), getattr(hf, "bert", None)):
        enc = getattr(root, "encoder", None) if root is not None else None
        if enc is not None and hasattr(enc, "layer"):
            return enc.layer[layer].attention.self
    raise ValueError(f"{type(hf).__name__} has no encoder.layer[i].attention.self: real_encoder supports "
                     "BERT-family encoders (query/key/value Linear layers)")


def multihead_self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, *,
                             max_scores: int = theory.MAX_SCORES) -> torch.Tensor:
    """Bidirectional multi-head attention on captured projections: q, k, v ``[..., head, n, e]``
    -> head outputs concatenated ``[..., n, head * e]`` (the "context layer", before the output
    projection, no mask)."""
    out = theory.attend(q, k, v, scale=scaling, max_scores=max_scores)       # [..., head, n, e]
    out = out.transpose(-3, -2)                                           # [..., n, head, e]
    return out.reshape(*out.shape[:-2], -1)


def head_blocks(mean: torch.Tensor, cov: torch.Tensor, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's own moments from those of the concatenated output: mean ``[..., h * e]`` ->
    ``[..., h, e]`` and the diagonal blocks of cov ``[..., h * e, h * e]`` -> ``[..., h, e, e]`` (head j's
    output is the slice ``j*e:(j+1)*e`` of the multi-head output, so these are exactly its moments)."""
    e = mean.shape[-1] // n_heads
    blocks = cov.reshape(*cov.shape[:-2], n_heads, e, n_heads, e).diagonal(dim1=-4, dim2=-2)   # [..., e, e, h]
    return mean.reshape(*mean.shape[:-1], n_heads, e), blocks.movedim(-1, -3)


def error_stats(err: np.ndarray, k: int) -> dict:
    """Mean, std over the k replicates (ddof=1) and error bar of the errors ``[k]`` (ERROR_BARS)."""
    std = float(err.std(ddof=1)) if k > 1 else 0.0
    return {"err_mean": float(err.mean()), "err_std": std, "err_se": std / math.sqrt(k), "k": k}


SUBSAMPLING_NOTE = "n positions i.i.d. uniform WITH replacement from the L window tokens (as the authors)"
REFERENCE_NOTE = ("multi-head self-attention output of the full L-token window (mean, population covariance "
                  "over its L output tokens), heads concatenated before the output projection")
RECOMPUTE_NOTE = ("attention recomputed on the subsample from the captured q, k, v (biases included) "
                  "with temperature trace.scaling")
HORIZON_NOTE = ("H = ||Sigma^1/2 A Sigma^1/2||_2, Sigma = population covariance of the layer inputs "
                "(+ eps I, eps={eps}), A = scaling * sum_h W_kh^T W_qh (biases ignored); "
                "horizon_authors without scaling; kind='head' rows: the same with A_h = scaling * W_kh^T W_qh")
PER_HEAD_NOTE = ("kind='head_point' rows: errors of head j's output block (mean: its e coordinates; covariance: "
                 "its e x e diagonal block) against the same block of the L-token reference, same subsamples; "
                 "kind='head' rows: their slope fits (beta_mean, beta_cov, *_se) with the layer's fit")
MOMENTS = ("mean", "cov")


@dataclass(frozen=True)
class _Sampling:
    """The subsampling settings shared by every layer of :func:`real_encoder`: n of the n_tokens window
    positions, k times, for each n in n_values."""

    n_tokens: int
    n_values: list
    k: int
    seed: int
    device: str
    dtype: torch.dtype
    cov_norm: str
    max_scores: int


@dataclass
class _LayerErrors:
    """One layer's horizons (layer, per head [h]) and its error rows: ``point`` and ``head_point``."""

    layer: int
    horizon: float
    horizon_authors: float
    head_horizons: torch.Tensor
    n_heads: int
    d_head: int
    points: list
    head_points: list


def _encoder_window(model, ids, text: Optional[str], corpus: str, L: Optional[int], offset: int,
                   quick: bool) -> tuple[torch.Tensor, dict]:
    """Token ids ``[L]`` (``ids`` as given, else a window of ``text`` or of the corpus) and the text's provenance."""
    text_prov: dict = {}
    if ids is None:
        if text is None:
            from attnlab.core.text import load_corpus

            c = load_corpus(corpus)
            text, text_prov = c.text, c.provenance()
        else:
            text_prov = {"text": "user text", "text_sha256": hashlib.sha256(text.encode()).hexdigest()}
        L = int(L or model.max_positions)
        if quick:
            L = min(L, 64)
        ids = model.window(text, L, offset)
    return torch.as_tensor(ids).long(), text_prov


def _checked_layers(trace, layers: Optional[Sequence[int]]) -> list[int]:
    """The requested layers (all of the trace's when None); ValueError for one the trace lacks."""
    wanted = list(trace.layers) if layers is None else [int(l) for l in layers]
    missing = [l for l in wanted if l not in trace.layers]
    if missing:
        raise ValueError(f"layers {missing} not in the trace (layers {trace.layers})")
    return wanted


def _layer_horizons(hf, hidden: torch.Tensor, layer: int, scaling: float, n_heads: int,
                   eps: float) -> tuple[float, float, torch.Tensor]:
    """H (with ``scaling``), H without it (the authors') and the per-head horizons ``[h]`` of one layer, with
    Sigma = population covariance of its inputs hidden ``[L, d_model]``."""
    hid = hidden.to(torch.float64)
    cen = hid - hid.mean(0)
    Sigma = cen.T @ cen / hid.shape[0]
    attn = _self_attention_module(hf, layer)
    Wq = attn.query.weight.detach().to("cpu", torch.float64)
    Wk = attn.key.weight.detach().to("cpu", torch.float64)
    A_raw = Wk.T @ Wq
    return (theory.horizon(scaling * A_raw, Sigma, eps=eps), theory.horizon(A_raw, Sigma, eps=eps),
            theory.head_horizons(Wq, Wk, Sigma, n_heads, scaling=scaling, eps=eps))


def _subsample_errors(q: torch.Tensor, kk: torch.Tensor, v: torch.Tensor, ref: tuple, idx: torch.Tensor,
                      scaling: float, sp: _Sampling) -> dict[str, np.ndarray]:
    """Errors of the subsamples idx ``[k, n]`` of q, k, v ``[h, L, e]`` against ref, the full window's output
    moments (``[h*e]``, ``[h*e, h*e]``): "mean", "cov" ``[k]`` (the layer) and "head_mean", "head_cov" ``[k, h]``
    (each head's block)."""
    nh, n = q.shape[0], idx.shape[1]
    ref_h = head_blocks(*ref, nh)                                                          # [h, e], [h, e, e]
    b = mc.replicate_batch(n, sp.k, sp.max_scores, sp.device, heads=nh)
    errs = {key: [] for key in ("mean", "cov", "head_mean", "head_cov")}
    for s in range(0, sp.k, b):
        sub = idx[s:s + b]                                                                  # [b, n]
        qs, ks, vs = (t[:, sub].transpose(0, 1) for t in (q, kk, v))                        # [b, h, n, e]
        mean, cov = theory.output_moments(multihead_self_attention(qs, ks, vs, scaling, max_scores=sp.max_scores))
        a, c = theory.moment_errors(mean, cov, *ref, cov_norm=sp.cov_norm)                  # [b]
        ah, ch = theory.moment_errors(*head_blocks(mean, cov, nh), *ref_h, cov_norm=sp.cov_norm)   # [b, h]
        for key, val in zip(errs, (a, c, ah, ch)):
            errs[key].append(val.cpu())
    return {key: torch.cat(val).numpy() for key, val in errs.items()}


def _layer_errors(model, trace, layer: int, sp: _Sampling, eps: float) -> _LayerErrors:
    """Horizons and error rows (``point``: the layer; ``head_point``: each head) of one captured layer."""
    i = trace.layers.index(layer)
    q, kk, v = (getattr(trace, nm)[i].to(device=sp.device, dtype=sp.dtype) for nm in ("q", "k", "v"))   # [h, L, e]
    scaling, nh = float(trace.scaling), q.shape[0]
    ref = theory.output_moments(multihead_self_attention(q, kk, v, scaling, max_scores=sp.max_scores))
    H, H_auth, H_heads = _layer_horizons(model.hf, trace.hidden[i], layer, scaling, nh, eps)
    points, head_points = [], []
    for n in sp.n_values:
        gen = mc.make_generator(mc.derive_seed(sp.seed, layer, n), sp.device)
        idx = mc.subsample_iid(sp.n_tokens, n, sp.k, generator=gen, device=sp.device)                 # [k, n]
        errs = _subsample_errors(q, kk, v, ref, idx, scaling, sp)
        for mom in MOMENTS:
            points.append({"kind": "point", "layer": layer, "horizon": H, "horizon_authors": H_auth, "n": n,
                           "moment": mom, **error_stats(errs[mom], sp.k)})
            head_points += [{"kind": "head_point", "layer": layer, "head": h, "n": n, "moment": mom,
                             **error_stats(errs["head_" + mom][:, h], sp.k)} for h in range(nh)]
    return _LayerErrors(layer, H, H_auth, H_heads, nh, q.shape[-1], points, head_points)


def _head_fit_rows(le: _LayerErrors, fit: str, scaling: float, k: int) -> list[dict]:
    """``kind="head"`` rows: each head's horizon and slope fits of its ``head_point`` rows."""
    rows = []
    for h in range(le.n_heads):
        fm, fc = (fit_row([r for r in le.head_points if r["head"] == h and r["moment"] == mom], fit)
                  for mom in MOMENTS)
        Hh = float(le.head_horizons[h])
        rows.append({"kind": "head", "layer": le.layer, "head": h, "horizon": Hh, "horizon_authors": Hh / scaling,
                     "beta_ref": theory.beta_reference(Hh), "beta_ref_authors": theory.beta_reference(Hh / scaling),
                     "d_head": le.d_head, "beta_mean": fm["beta"], "beta_mean_se": fm["slope_se"],
                     "intercept_mean": fm["intercept"], "beta_cov": fc["beta"], "beta_cov_se": fc["slope_se"],
                     "intercept_cov": fc["intercept"], "n_points": fm["n_points"], "k": k})
    return rows


def _layer_fit_rows(rows: list[dict], le: _LayerErrors, fit: str, k: int) -> list[dict]:
    """``kind="fit"`` rows (mean, cov) of a layer: slope fits of its ``point`` rows among ``rows``."""
    out = []
    for mom in MOMENTS:
        fr = fit_row([r for r in rows if r["kind"] == "point" and r["layer"] == le.layer and r["moment"] == mom], fit)
        out.append({"kind": "fit", "layer": le.layer, "horizon": le.horizon, "horizon_authors": le.horizon_authors,
                    "moment": mom, **fr, "beta_ref": theory.beta_reference(le.horizon),
                    "beta_ref_authors": theory.beta_reference(le.horizon_authors), "k": k, "n_heads": le.n_heads,
                    "d_head": le.d_head})
    return out


def real_encoder(model="minilm", *, quick: bool = False, preset: str = "default",
                 ids: Optional[torch.Tensor] = None, text: Optional[str] = None, corpus: str = "wikitext2",
                 L: Optional[int] = None, offset: int = 0, layers: Optional[Sequence[int]] = None,
                 n_values: Optional[Sequence[int]] = None, k: Optional[int] = None, seed: int = 0,
                 eps: float = 0.0, cov_norm: str = "fro", device: str = "cpu", dtype="float32",
                 max_scores: int = theory.MAX_SCORES, fit: str = "wls") -> Result:
    """Token sample complexity of a pretrained encoder's self-attention, per layer.

    Protocol (the authors' BERT experiment, the authors' code, on attnlab's model and text):
    one window of L tokens (default the model's max positions; WikiText-2 test text unless `text`
    or `ids` are given) is captured once (q, k, v per head after projection, biases included; the
    layer inputs).  For each layer, the reference is the multi-head self-attention output of the
    full L-token sequence (heads concatenated, before the output projection): its mean and
    covariance over the L output tokens (a bootstrap-like target, paper 2 G6 of the appendix).  For each n, k subsamples
    of n token positions drawn i.i.d. *with replacement* from the L positions; attention is
    recomputed on the subsample from those tokens' captured q, k, v (same temperature
    ``trace.scaling``); errors of the output mean (L2) and covariance (``cov_norm``).

    Horizon per layer: ``Sigma`` = population covariance of the layer-input tokens (all L), plus
    ``eps I``; ``A = scaling * W_k^T W_q = scaling * sum_h W_{k,h}^T W_{q,h}`` from
    ``encoder.layer[l].attention.self.query/key`` weights (biases ignored, as the authors);
    ``horizon_authors`` omits ``scaling`` (the authors' code).  ``kind="head"`` rows add per-head
    horizons ``A_h = scaling * W_{k,h}^T W_{q,h}`` (:func:`theory.head_horizons`; the authors compute
    per-head H, without the temperature, in their downstream per-horizon code), with the same Sigma,
    and per-head exponents: head j's output is the slice ``j*e:(j+1)*e`` of the layer's output, so the same
    subsamples give its mean and covariance errors against its own block of the same L-token reference
    (:func:`head_blocks`; ``kind="head_point"`` rows), fitted with ``fit`` like the layer's:
    ``beta_mean``, ``beta_cov`` (= -slope), their standard errors ``beta_*_se`` and intercepts.

    ``model``: a name for :func:`attnlab.core.models.load_model` or an object with ``hf``, ``name``,
    ``max_positions``, ``capture(ids, keep=...)`` and ``window(text, L, offset)``.  When ``ids``
    (token ids ``[L]``) are given, ``text``/``corpus``/``L``/``offset`` are not used.
    ``quick=True`` caps the window at 64 tokens and uses n = 8, 16, 32 with k = 4.
    """
    t0 = time.perf_counter()
    fit_label(fit, "real_encoder")                        # validates fit
    cfg = preset_config(REAL_PRESETS, quick, preset, n_values=n_values, k=k)
    n_values = grid_values(cfg["n_values"], "n", integer=True)
    k = theory.check_positive_int(cfg["k"], "k")
    device, dt = check_device(device), as_dtype(dtype)
    if isinstance(model, str):
        from attnlab.core.models import load_model

        model = load_model(model, device=device)
    ids, text_prov = _encoder_window(model, ids, text, corpus, L, offset, quick)
    trace = model.capture(ids, keep=("q", "k", "v", "hidden"))
    wanted = _checked_layers(trace, layers)
    sp = _Sampling(int(ids.numel()), n_values, k, seed, device, dt, cov_norm, max_scores)
    rows = []
    for l in wanted:
        le = _layer_errors(model, trace, l, sp, eps)
        rows += le.points + le.head_points + _head_fit_rows(le, fit, float(trace.scaling), k)
        rows += _layer_fit_rows(rows, le, fit, k)
    prov = _real_provenance(model, trace, ids, text_prov, wanted, sp, quick=quick, preset=preset, offset=offset,
                            eps=eps, fit=fit, t0=t0)
    return Result("tsc_real", rows, prov)


def _real_provenance(model, trace, ids: torch.Tensor, text_prov: dict, wanted: list[int], sp: _Sampling, *,
                     quick: bool, preset: str, offset: int, eps: float, fit: str, t0: float) -> dict:
    """The provenance of :func:`real_encoder`'s Result (t0: its start, for the runtime)."""
    return provenance(
        experiment="real_encoder", paper=PAPER, result="2 on a real encoder (the authors' BERT protocol)",
        preset="quick" if quick else preset, model=getattr(model, "name", type(model).__name__),
        **({"model_info": model.provenance()} if hasattr(model, "provenance") else {}),
        **text_prov, trace_text_sha256=trace.text_sha256, window_tokens=sp.n_tokens, offset=offset,
        token_ids_sha256=hashlib.sha256(ids.numpy().astype(np.int64).tobytes()).hexdigest(),
        layers=wanted, n_values=sp.n_values, k=sp.k, seed=sp.seed,
        seeds=f"layer l, size n: subsample indices from derive_seed({sp.seed}, l, n)",
        subsampling=SUBSAMPLING_NOTE, reference=REFERENCE_NOTE, recompute=RECOMPUTE_NOTE,
        horizon_def=HORIZON_NOTE.format(eps=eps), per_head=PER_HEAD_NOTE,
        scaling=float(trace.scaling), cov_norm=sp.cov_norm, error_bars=ERROR_BARS, fit=fit_label(fit, "real_encoder"),
        fit_method=fit, temperature_convention=theory.TEMPERATURE_CONVENTION, dtype=str(sp.dtype),
        moments_dtype="float64", device=sp.device, max_scores=sp.max_scores, torch_threads=torch.get_num_threads(),
        runtime_s=round(time.perf_counter() - t0, 3))
