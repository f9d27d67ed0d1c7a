"""Token sample complexity of a pretrained encoder's self-attention, per layer and per head (the authors'
BERT protocol of arXiv 2512.10656 on attnlab's model and text; rows as in
`attnlab.sample_complexity.experiments`)."""
from __future__ import annotations

import hashlib
import math
import time
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
    ids = torch.as_tensor(ids).long()
    Lw = int(ids.numel())
    trace = model.capture(ids, keep=("q", "k", "v", "hidden"))
    scaling = float(trace.scaling)
    wanted = list(trace.layers) if layers is None else [int(l) for l in layers]
    missing = [l for l in wanted if l not in trace.layers]
    if missing:
        raise ValueError(f"layers {missing} not in the trace (layers {trace.layers})")

    rows = []
    for l in wanted:
        i = trace.layers.index(l)
        q, kk, v = (getattr(trace, nm)[i].to(device=device, dtype=dt) for nm in ("q", "k", "v"))   # [h, L, e]
        full = multihead_self_attention(q, kk, v, scaling, max_scores=max_scores)        # [L, h*e]
        ref = theory.output_moments(full)
        hid = trace.hidden[i].to(torch.float64)                                           # [L, d_model]
        cen = hid - hid.mean(0)
        Sigma = cen.T @ cen / hid.shape[0]
        attn = _self_attention_module(model.hf, l)
        Wq = attn.query.weight.detach().to("cpu", torch.float64)
        Wk = attn.key.weight.detach().to("cpu", torch.float64)
        A_raw = Wk.T @ Wq
        H = theory.horizon(scaling * A_raw, Sigma, eps=eps)
        H_auth = theory.horizon(A_raw, Sigma, eps=eps)
        nh, e = q.shape[0], q.shape[-1]
        H_heads = theory.head_horizons(Wq, Wk, Sigma, nh, scaling=scaling, eps=eps)
        ref_h = head_blocks(*ref, nh)                                                      # [h, e], [h, e, e]
        head_pts = []
        for n in n_values:
            gen = mc.make_generator(mc.derive_seed(seed, l, n), device)
            idx = mc.subsample_iid(Lw, n, k, generator=gen, device=device)                 # [k, n]
            b = mc.replicate_batch(n, k, max_scores, device, heads=nh)
            errs = {key: [] for key in ("mean", "cov", "head_mean", "head_cov")}
            for s in range(0, k, b):
                sub = idx[s:s + b]                                                          # [b, n]
                qs, ks, vs = (t[:, sub].transpose(0, 1) for t in (q, kk, v))                # [b, h, n, e]
                mean, cov = theory.output_moments(multihead_self_attention(qs, ks, vs, scaling, max_scores=max_scores))
                a, c = theory.moment_errors(mean, cov, *ref, cov_norm=cov_norm)             # [b]
                ah, ch = theory.moment_errors(*head_blocks(mean, cov, nh), *ref_h, cov_norm=cov_norm)   # [b, h]
                for key, val in zip(errs, (a, c, ah, ch)):
                    errs[key].append(val.cpu())
            for mom in ("mean", "cov"):
                rows.append({"kind": "point", "layer": l, "horizon": H, "horizon_authors": H_auth, "n": n,
                             "moment": mom, **error_stats(torch.cat(errs[mom]).numpy(), k)})
                per_head = torch.cat(errs["head_" + mom]).numpy()                            # [k, h]
                head_pts += [{"kind": "head_point", "layer": l, "head": h, "n": n, "moment": mom,
                              **error_stats(per_head[:, h], k)} for h in range(nh)]
        rows += head_pts
        for h in range(nh):
            fm, fc = (fit_row([r for r in head_pts if r["head"] == h and r["moment"] == mom], fit)
                      for mom in ("mean", "cov"))
            Hh = float(H_heads[h])
            rows.append({"kind": "head", "layer": l, "head": h, "horizon": Hh, "horizon_authors": Hh / scaling,
                         "beta_ref": theory.beta_reference(Hh), "beta_ref_authors": theory.beta_reference(Hh / scaling),
                         "d_head": e, "beta_mean": fm["beta"], "beta_mean_se": fm["slope_se"],
                         "intercept_mean": fm["intercept"], "beta_cov": fc["beta"], "beta_cov_se": fc["slope_se"],
                         "intercept_cov": fc["intercept"], "n_points": fm["n_points"], "k": k})
        for mom in ("mean", "cov"):
            fr = fit_row([r for r in rows if r["kind"] == "point" and r["layer"] == l and r["moment"] == mom], fit)
            rows.append({"kind": "fit", "layer": l, "horizon": H, "horizon_authors": H_auth, "moment": mom,
                         **fr, "beta_ref": theory.beta_reference(H), "beta_ref_authors": theory.beta_reference(H_auth),
                         "k": k, "n_heads": nh, "d_head": e})
    prov = provenance(
        experiment="real_encoder", paper=PAPER, result="2 on a real encoder (the authors' BERT protocol)",
        preset="quick" if quick else preset, model=getattr(model, "name", type(model).__name__),
        **({"model_info": model.provenance()} if hasattr(model, "provenance") else {}),
        **text_prov, trace_text_sha256=trace.text_sha256, window_tokens=Lw, offset=offset,
        token_ids_sha256=hashlib.sha256(ids.numpy().astype(np.int64).tobytes()).hexdigest(),
        layers=wanted, n_values=n_values, k=k, seed=seed,
        seeds=f"layer l, size n: subsample indices from derive_seed({seed}, l, n)",
        subsampling="n positions i.i.d. uniform WITH replacement from the L window tokens (as the authors)",
        reference="multi-head self-attention output of the full L-token window (mean, population covariance "
                  "over its L output tokens), heads concatenated before the output projection",
        recompute="attention recomputed on the subsample from the captured q, k, v (biases included) "
                  "with temperature trace.scaling",
        horizon_def="H = ||Sigma^1/2 A Sigma^1/2||_2, Sigma = population covariance of the layer inputs "
                    f"(+ eps I, eps={eps}), A = scaling * sum_h W_kh^T W_qh (biases ignored); "
                    "horizon_authors without scaling; kind='head' rows: the same with A_h = scaling * W_kh^T W_qh",
        per_head="kind='head_point' rows: errors of head j's output block (mean: its e coordinates; covariance: "
                 "its e x e diagonal block) against the same block of the L-token reference, same subsamples; "
                 "kind='head' rows: their slope fits (beta_mean, beta_cov, *_se) with the layer's fit",
        scaling=scaling, cov_norm=cov_norm, error_bars=ERROR_BARS, fit=fit_label(fit, "real_encoder"), fit_method=fit,
        temperature_convention=theory.TEMPERATURE_CONVENTION, dtype=str(dt), moments_dtype="float64",
        device=device, max_scores=max_scores, torch_threads=torch.get_num_threads(),
        runtime_s=round(time.perf_counter() - t0, 3))
    return Result("tsc_real", rows, prov)
