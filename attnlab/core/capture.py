"""Capturing attention through transformers' AttentionInterface; the Trace object.

Trace is the one object that crosses from the model world into the math world.
"""
from __future__ import annotations

import contextlib
import functools
import math
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from attnlab.core.util import last_visible

KEEPABLE = ("q", "k", "v", "scores", "probs", "hidden")


@dataclass
class Trace:
    """Attention tensors of one forward pass, float32, batch of one sequence.

    q, k, v:   [layer, head, token, d_head]   (after projection, biases included, after RoPE where the model
               has it; before scaling). Grouped-query models: k and v per query head, the shared key/value
               head repeated (query head h reads key/value head h // (heads per key/value head))
    scores:    [layer, head, query, key]      scaled logits `scaling * q.k`, masked entries = -inf; under logit
               softcapping (Gemma 2: `softcap` c) the capped logits `c * tanh(scaling * q.k / c)`, which the
               softmax (or a swapped normalizer) receives
    probs:     [layer, head, query, key]      the model's attention weights (0 on masked keys); with attention
               sinks (gpt-oss: one learned logit per head in the softmax's denominator) rows sum to less than 1
    hidden:    [layer, token, d_model]        input of each attention block (GPT-2: after ln_1)
    layers / heads: the model's layer and head index for each entry of the first two axes.
    kinds: (kind, window) of each entry of the layer axis (`models.layer_kinds`) where a layer is not "full"
           (Gemma 3's sliding-window layers); None: every layer full, the causal or bidirectional mask.
    """

    model_name: str
    token_ids: torch.Tensor
    layers: list[int]
    heads: list[int]
    causal: bool
    scaling: float
    text_sha256: Optional[str] = None
    q: Optional[torch.Tensor] = None
    k: Optional[torch.Tensor] = None
    v: Optional[torch.Tensor] = None
    scores: Optional[torch.Tensor] = None
    probs: Optional[torch.Tensor] = None
    hidden: Optional[torch.Tensor] = None
    meta: dict = field(default_factory=dict)
    kinds: Optional[list] = None
    masks: dict = field(default_factory=dict, repr=False, compare=False)   # `visible`'s memo, shared with its cuts

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[-1])

    def visible(self, length: Optional[int] = None, layer: Optional[int] = None) -> torch.Tensor:
        """bool [query, key]: which keys each query row sees (`visible_mask`: the lower triangle when causal, only the
        last `window` keys in a sliding-window layer). layer: a position on the layer axis; None: the mask every
        layer of the trace shares, a ValueError where its layers see different keys (`visible_layers`). Each mask is
        formed once per (length, kind) and shared with the traces cut from this one (`select_layers`, `prefix`):
        read it, never write into it."""
        n = self.n_tokens if length is None else length
        kinds = self.kinds or [("full", None)]
        if layer is not None:
            if not -len(self.layers) <= layer < len(self.layers):
                raise IndexError(f"layer {layer} is outside this trace's {len(self.layers)} layers (a position)")
            return self._mask(n, *(self.kinds[layer] if self.kinds else ("full", None)))
        if len(set(map(tuple, kinds))) > 1:
            raise ValueError(f"{self.model_name}: this trace's layers see different keys ({layer_kinds_text(kinds)}): "
                             "one [query, key] mask would count keys outside a sliding window; pass layer= to "
                             "visible() (or use visible_layers()), or capture layers of one kind")
        return self._mask(n, *kinds[0])

    def _mask(self, n: int, kind: str, window: Optional[int]) -> torch.Tensor:
        """`visible_mask(n, causal, kind, window)`, from the memo `masks` where it was formed before."""
        key = (n, kind, window)
        if key not in self.masks:
            self.masks[key] = visible_mask(n, self.causal, kind, window)
        return self.masks[key]

    def visible_layers(self, length: Optional[int] = None) -> torch.Tensor:
        """bool [layer, 1, query, key]: `visible` of each entry of the layer axis (broadcasts over the heads)."""
        return torch.stack([self.visible(length, layer=i) for i in range(len(self.layers))]).unsqueeze(1)

    def kind_groups(self) -> list[list[int]]:
        """Positions on the layer axis grouped by layer kind ((kind, window) of `kinds`), in order of first
        appearance: one group of every position where all layers see the same keys (full-only models)."""
        groups: dict = {}
        for i, kind in enumerate(self.kinds or [("full", None)] * len(self.layers)):
            groups.setdefault(tuple(kind), []).append(i)
        return list(groups.values())

    def select_layers(self, positions: Sequence[int]) -> "Trace":
        """The trace of the entries `positions` of the layer axis, their kinds kept (a trace with kinds keeps them
        where the positions are all full: its rows still say "full")."""
        idx = torch.as_tensor(list(positions), dtype=torch.long)
        cut = {name: None if getattr(self, name) is None else getattr(self, name)[idx]
               for name in ("q", "k", "v", "scores", "probs", "hidden")}
        kinds = None if self.kinds is None else [self.kinds[i] for i in idx.tolist()]
        return Trace(self.model_name, self.token_ids, [self.layers[i] for i in idx.tolist()], self.heads, self.causal,
                     self.scaling, self.text_sha256, meta=dict(self.meta), kinds=kinds, masks=self.masks, **cut)

    def prefix(self, length: int) -> "Trace":
        """The trace of the first `length` tokens. Exact for causal models only (row t sees keys <= t)."""
        if not self.causal:
            raise ValueError("prefix() is exact only for causal models; run one pass per length instead")
        # (sliding-window layers too: row t sees keys t - window < s <= t at every length)
        if not 1 <= length <= self.n_tokens:
            raise ValueError(f"length must be in [1, {self.n_tokens}], got {length}")
        cut = {}
        for name in ("q", "k", "v", "hidden"):
            t = getattr(self, name)
            cut[name] = None if t is None else t[..., :length, :]
        for name in ("scores", "probs"):
            t = getattr(self, name)
            cut[name] = None if t is None else t[..., :length, :length]
        return Trace(self.model_name, self.token_ids[:length], self.layers, self.heads, self.causal,
                     self.scaling, self.text_sha256, meta=dict(self.meta, prefix_of=self.n_tokens), kinds=self.kinds,
                     masks=self.masks, **cut)

    def provenance(self) -> dict:
        """What produced this trace, for a Result's provenance."""
        return {"model": self.model_name, "n_tokens": self.n_tokens, "causal": self.causal,
                "scaling": self.scaling, "text_sha256": self.text_sha256, "layers": self.layers,
                "heads": self.heads, **self.meta,
                **({"layer_kinds": [list(k) for k in self.kinds]} if self.kinds else {})}


def visible_mask(n: int, causal: bool, kind: str = "full", window: Optional[int] = None) -> torch.Tensor:
    """bool [query, key] of n tokens: every key (bidirectional), keys s <= t (causal), and in a causal "sliding" layer
    only the last `window` of them, t - window < s <= t (transformers' `sliding_window_overlay`: kv > q - window).
    The one place for this fact. Other kinds (chunked) and bidirectional windows are refused (ValueError)."""
    full = torch.ones(n, n, dtype=torch.bool)
    if kind == "full":
        return torch.tril(full) if causal else full
    if kind == "sliding" and causal and window is not None:
        return torch.tril(full) & torch.triu(full, diagonal=1 - int(window))
    raise ValueError(f"no visibility mask for a {'causal' if causal else 'bidirectional'} {kind!r} layer "
                     f"(window {window}): attnlab knows full layers and causal sliding-window layers only")


def all_full(kinds) -> bool:
    """Whether every (kind, window) of `kinds` (`layer_kinds`) is a full layer: every earlier key visible (causal)."""
    return all(kind == "full" for kind, _ in kinds)


def layer_kinds_text(kinds) -> str:
    """"sliding 512 on 15 of 18, full on 3 of 18" for kinds [(kind, window)] (`models.layer_kinds`)."""
    counts: dict = {}
    for kind, window in kinds:
        counts[(kind, window)] = counts.get((kind, window), 0) + 1
    return ", ".join(f"{k}{'' if w is None else f' {w}'} on {c} of {len(kinds)}" for (k, w), c in counts.items())


# --------------------------------------------------------------------------- the capturing mechanism
#
# One attention function and one mask function are registered with transformers under the name
# "attnlab". The function computes exactly what the eager implementation computes, and, when the
# calling module carries an `_attnlab` state (set by AttnModel), records tensors and/or swaps the
# normalizer for that layer. The mask function must be registered too: without it a custom attention
# function receives no mask at all and a causal model silently attends to the future.

IMPLEMENTATION = "attnlab"
CHUNK_ELEMENTS = 1 << 22    # scores formed at a time on the CPU (16 MiB of float32): `attention_blocks`


class CaptureState:
    """Per-model state read by the attention function (one object per AttnModel, not global)."""

    def __init__(self):
        self.calls: list = []                  # modules in call order (layer discovery)
        self.discovering = False
        self.recording = False
        self.keep: set[str] = set()
        self.layers: Optional[set[int]] = None
        self.heads: Optional[list[int]] = None
        self.records: dict[int, dict[str, torch.Tensor]] = {}
        self.normalizers: dict[int, object] = {}
        self.mask_seen: Optional[torch.Tensor] = None
        self.buffers: dict[str, torch.Tensor] = {}   # name -> [layer, head, query, key], written in place
        self.storage: Optional[dict[str, torch.Tensor]] = None   # name -> flat memory the buffers may reuse
        self.stop_after: Optional[int] = None        # raise StopCapture once this layer is recorded
        self.weights_unused = False                  # the pass reads no attention weights: return None for them
        self.spans: dict = {}                        # this forward pass's `mask_spans`: emptied as each pass starts

    def new_pass(self, *_) -> None:
        """A forward pass of the model starts (its pre-hook, `AttnModel`): the masks of the last one are gone."""
        self.spans = {}

    def mask_spans(self, mask: Optional[torch.Tensor], k_len: int) -> dict:
        """The dict `attnlab_attention` fills with the keys (lo, hi) each part of `mask` (cut to k_len keys) lets
        through, one per mask of this forward pass: its layers get the same mask object (one per layer kind), so
        each part's keys are found once per pass. The masks live until the pass ends, so their ids are theirs."""
        return {} if mask is None else self.spans.setdefault((id(mask), k_len), {})

    def start(self, keep: set[str], layers: list[int], heads: Optional[list[int]],
              storage: Optional[dict[str, torch.Tensor]] = None) -> None:
        self.records, self.buffers, self.keep, self.storage = {}, {}, set(keep), storage
        self.layers, self.heads, self.layer_order = set(layers), heads, {l: i for i, l in enumerate(layers)}
        self.recording = True

    def has_buffer(self, name: str) -> bool:
        return name in self.buffers

    def slot(self, name: str, layer: int, shape, device) -> Optional[torch.Tensor]:
        """A [1, head, query, key] view of the buffer for `name` at `layer` (head: the recorded heads), or None
        when writing in place is not possible (not kept, a head subset of several layers, batch > 1, not on
        the CPU)."""
        subset = self.heads is not None
        if name not in self.keep or (subset and len(self.layer_order) > 1) or shape[0] != 1 or device.type != "cpu":
            return None
        if name not in self.buffers:
            n_heads = len(self.heads) if subset else shape[1]
            self.buffers[name] = self._memory(name, (len(self.layer_order), n_heads, *shape[2:]))
        i = self.layer_order[layer]
        return self.buffers[name][i:i + 1]

    def _memory(self, name: str, shape: tuple) -> torch.Tensor:
        """An uninitialised float32 tensor of `shape`: the front of `storage[name]` when a storage is given (grown
        when too small), so that a caller capturing block after block writes into memory it already has (a fresh
        GB-sized tensor costs a page fault per 4 KiB, about a second of system time per block at L = 8192)."""
        n = math.prod(shape)
        if self.storage is None:
            return torch.empty(shape, dtype=torch.float32)
        if name not in self.storage or self.storage[name].numel() < n:
            self.storage.pop(name, None)                                 # (free the smaller one first)
            self.storage[name] = torch.empty(n, dtype=torch.float32)
        return self.storage[name][:n].view(shape)


def visible_from_mask(mask: Optional[torch.Tensor], q_len: int, k_len: int) -> torch.Tensor:
    """bool [b|1, 1|h, q, k] from an additive float mask (0 = visible) or a bool mask (True = visible)."""
    if mask is None:
        return torch.ones(1, 1, q_len, k_len, dtype=torch.bool)
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


# The keywords transformers' attention callers pass (every `attention_interface(...)` call of transformers 5.x's
# models/*/modeling_*.py), by what the eager attention does with them:
IMPLEMENTED = ("softcap", "s_aux", "sinks")     # computed below exactly as eager: logit softcapping, sink logits
NO_EFFECT = ("is_causal", "sliding_window", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
             "max_length_k", "output_attentions", "use_top_left_mask", "deterministic", "target_dtype",
             "use_cache", "cache_position", "output_router_logits", "output_hidden_states", "return_dict",
             "past_key_values")
# ^ read only by other kernels (flash, sdpa, varlen) or not at all (a model's forward flags, which many models pass
#   down to the attention: `model.forward(ids, output_hidden_states=True)`): the eager attention ignores them; a
#   cache's keys are refused as keys that are not the tokens (`refuse_unsupported`); the window
#   and the causality come in `attention_mask` (attnlab's mask function is transformers' eager_mask)


class UnsupportedAttention(ValueError):
    """An attention computation attnlab's function does not reproduce: the model is refused, not measured."""


def model_type(module) -> str:
    """The model type of an attention module ("gemma2"), else its class name."""
    return getattr(getattr(module, "config", None), "model_type", None) or type(module).__name__


def unsupported_feature(kwargs: dict) -> Optional[str]:
    """The first keyword in `kwargs` with a value (not None) that changes the attention and that attnlab does not
    compute (not in IMPLEMENTED or NO_EFFECT), else None."""
    for name, value in kwargs.items():
        if value is not None and name not in IMPLEMENTED and name not in NO_EFFECT:
            return name
    return None


def eager_reference(module):
    """The model's own eager attention function (`eager_attention_forward` of the module's modeling file), or
    None where its file has none."""
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


def check_against_eager(module, args: tuple, kwargs: dict, output: torch.Tensor, weights, tol: float = 1e-6) -> None:
    """Raise UnsupportedAttention when the model's eager attention, run on the same `args` (query, key, value,
    mask) and `kwargs`, gives another output [batch, token, head, d_head] or other weights than attnlab's:
    features read from the module itself (not passed as keywords) are caught here, at load."""
    fn = eager_reference(module)
    if fn is None:
        return
    try:
        ref_out, ref_w = fn(module, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure: the check could not be made, so refuse
        raise UnsupportedAttention(f"{model_type(module)}: its eager attention could not be run on attnlab's "
                                   f"arguments ({type(exc).__name__}: {exc}); refusing rather than measuring a "
                                   "different attention") from None
    pairs = [(output, ref_out)] + ([(weights, ref_w)] if weights is not None and ref_w is not None else [])
    for ours, ref in pairs:
        if ours.shape != ref.shape or not bool(((ours - ref).abs() <= tol * (1 + ref.abs())).all()):
            diff = f"{(ours - ref).abs().max().item():.1e}" if ours.shape == ref.shape else "shape"
            raise UnsupportedAttention(f"{model_type(module)}: attnlab's attention differs from the model's eager "
                                       f"attention (max abs difference {diff}); refusing rather than measuring a "
                                       "different attention")


def refuse_unsupported(module, query, key, kwargs: dict):
    """Raise UnsupportedAttention for a call attnlab would not compute as eager does: a keyword it does not know
    (`unsupported_feature`), keys that are not the tokens (query [b, h, q, d], key [b, h_kv, k, d] with k != q),
    a normalizer swap with attention sinks. Returns the module's swapped normalizer (None: softmax)."""
    where = model_type(module)
    feature = unsupported_feature(kwargs)
    if feature is not None:
        raise UnsupportedAttention(f"{where}: attention feature {feature!r} is not implemented by attnlab's "
                                   "capture; refusing rather than measuring a different attention")
    if key.shape[-2] != query.shape[-2]:      # a Trace is [query, key] over the same tokens: keys added inside
        raise UnsupportedAttention(f"{where}: {key.shape[-2]} keys for {query.shape[-2]} queries (keys that are "
                                   "not the tokens: compressed or cached); refusing rather than measuring a "
                                   "different attention")
    state = getattr(module, "_attnlab", None)
    swap = state.normalizers.get(getattr(module, "_attnlab_layer", None)) if state is not None else None
    if swap is not None and kwargs.get("s_aux", kwargs.get("sinks")) is not None:
        raise UnsupportedAttention(f"{where}: a normalizer swap is not defined with attention sinks (the sink "
                                   "logit is not a key); refusing")
    return swap


def attnlab_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention (same ops, same result) + optional recording + optional normalizer swap.

    query/key/value: [batch, head, token, d_head]; returns ([batch, token, head, d_head], probs), probs None
    where nobody reads them (`CaptureState.weights_unused`). While recording on the CPU, scores and probs are
    written straight into the Trace's buffers (`out=`), so capturing costs no extra copy of the [head, query,
    key] matrices. On the CPU the [query, key] matrices are formed a few heads, or a block of one head's query
    rows, at a time (`attention_blocks`): same numbers, small temporaries; a block of rows leaves out the keys
    the mask hides from all of them (`seen_keys`: causal rows, about half the keys at long L; `first_seen_key`:
    a sliding-window layer's rows, a band of `window` keys), whose weights are 0 (and scores -inf when recorded).
    In the last recorded layer only the recorded heads are computed and no output is formed: the pass stops there.
    """
    swap = refuse_unsupported(module, query, key, kwargs)
    state: Optional[CaptureState] = getattr(module, "_attnlab", None)
    layer = getattr(module, "_attnlab_layer", None)
    discovering, originals = state is not None and state.discovering, (query, key, value, attention_mask)
    if discovering:
        state.calls.append(module)
        state.mask_seen = attention_mask
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux", kwargs.get("sinks"))   # sinks [head]: `sink_softmax`
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    if key.shape[1] != query.shape[1]:  # grouped-query attention: each key/value head serves a group
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    full_mask = attention_mask
    if attention_mask is not None:
        attention_mask = attention_mask[..., : key.shape[-2]]
    recording = state is not None and state.recording and (state.layers is None or layer in state.layers)
    last = recording and layer == state.stop_after          # StopCapture follows: nothing reads the output
    shape = (*query.shape[:-1], key.shape[-2])  # [batch, head, query, key]
    heads = state.heads if last and state.heads is not None else list(range(shape[1]))   # the heads computed
    slot = (lambda name: state.slot(name, layer, shape, query.device)) if recording else (lambda name: None)
    scores_out, probs_out = slot("scores"), slot("probs")   # [1, position in `heads`, query, key] or None
    scores = scores_out
    if scores is None and recording and "scores" in state.keep:
        scores = query.new_empty(shape)           # kept below (a head subset, a batch, not on the CPU)
    weights_read = not last and not (state is not None and state.weights_unused)
    probs = None
    if probs_out is None and (weights_read or (recording and "probs" in state.keep)):
        probs = query.new_empty(shape)
    output = None if last else query.new_empty((*shape[:-1], value.shape[-1]))   # [batch, head, query, d_head]
    visible = visible_from_mask(attention_mask, shape[-2], shape[-1]) if swap is not None else None
    spans = state.mask_spans(full_mask, key.shape[-2]) if state is not None else {}   # a part -> its keys (lo, hi)
    for b, at, hs, rows in attention_blocks(shape, heads, query.device):
        mask = _pick(attention_mask, b, hs, rows)
        lo, hi = 0, shape[-1]
        if swap is None and mask is not None and query.device.type == "cpu":   # (normalizers see every key)
            lo, hi = _keys_seen(spans, attention_mask, mask, b, hs, rows)
        kept = _part(scores_out, scores, b, at, hs, rows)
        kept = None if kept is None else kept[..., lo:hi]
        s = torch.matmul(query[b, hs, rows], key[b, hs, lo:hi].transpose(-1, -2), out=kept)
        s = s.mul_(scaling) if kept is not None else s * scaling
        if softcap is not None:                                       # eager's order: / c, tanh, * c
            s = s.div_(softcap).tanh_().mul_(softcap)
        target = _part(probs_out, probs, b, at, hs, rows)
        if target is not None:                      # keys outside [lo, hi): 0 (scores there: -inf, set by `_record`)
            target[..., :lo], target[..., hi:] = 0.0, 0.0
        target = None if target is None else target[..., lo:hi]
        logits = s + mask[..., lo:hi] if mask is not None and swap is None else s
        if swap is None and sinks is None:
            target = torch.softmax(logits, dim=-1, out=target)
        else:
            w = sink_softmax(logits, sinks[hs]) if swap is None else swap(s, _pick(visible, b, hs, rows))
            target = w if target is None else target.copy_(w)
        if output is not None:
            p = torch.nn.functional.dropout(target, p=dropout, training=module.training)
            torch.matmul(p, value[b, hs, lo:hi], out=output[b, hs, rows])
    if recording:
        _record(state, layer, query, key, value, scores, probs, attention_mask, direct=scores_out is not None)
        if last:
            raise StopCapture      # the later layers cannot change what was recorded
    weights = (probs_out if probs_out is not None else probs) if weights_read else None
    result = output.transpose(1, 2).contiguous()
    if discovering and swap is None:
        check_against_eager(module, originals, dict(kwargs, scaling=scaling, dropout=dropout), result, weights)
    return result, weights


def _keys_seen(spans: dict, attention_mask: torch.Tensor, mask: torch.Tensor, b: int, hs: slice,
               rows: slice) -> tuple[int, int]:
    """(lo, hi): the keys that the block (b, hs, rows) of `attention_mask` lets its rows see (`mask`, that block:
    `first_seen_key`, `seen_keys`), found once per part of the mask and kept in `spans` (`CaptureState.mask_spans`)."""
    part = (min(b, attention_mask.shape[0] - 1), (hs.start, hs.stop) if attention_mask.shape[1] > 1 else None,
            (rows.start, rows.stop))
    if part not in spans:
        spans[part] = (first_seen_key(mask), seen_keys(mask))
    return spans[part]


def sink_softmax(logits: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Softmax of logits [head, row, key] with one more column per head holding sinks [head], that column then
    dropped (gpt-oss's eager order: concatenate, subtract the row max, softmax): weights [head, row, key]."""
    column = sinks.to(logits.dtype).reshape(-1, 1, 1).expand(logits.shape[0], logits.shape[1], 1)
    combined = torch.cat([logits, column], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    return torch.softmax(combined, dim=-1)[..., :-1]


def attention_blocks(shape, heads: list[int], device, elements: Optional[int] = None) -> list[tuple]:
    """(batch index, positions in `heads`, model heads, query rows) slices covering the `heads` of a [batch,
    head, query, key] attention. On the CPU a block holds as many consecutive heads as fit in `elements` scores,
    or a block of one head's query rows where one head does not fit (small temporaries are reused; a fresh
    100 MiB tensor costs more in page faults than the arithmetic on it); elsewhere every head at once."""
    n_q, n_k = shape[2], shape[3]
    cpu, elements = device.type == "cpu", elements or CHUNK_ELEMENTS
    per = max(1, min(len(heads), elements // max(1, n_q * n_k))) if cpu else len(heads)
    step = max(1, min(n_q, elements // max(1, n_k))) if cpu else n_q
    runs, j = [], 0                        # runs of consecutive heads, at most `per` long
    while j < len(heads):
        k = j + 1
        while k < len(heads) and k - j < per and heads[k] == heads[k - 1] + 1:
            k += 1
        runs.append((slice(j, k), slice(heads[j], heads[k - 1] + 1)))
        j = k
    return [(b, at, hs, slice(r, min(r + step, n_q))) for b in range(shape[0]) for at, hs in runs
            for r in range(0, n_q, step)]


def _part(slot: Optional[torch.Tensor], full: Optional[torch.Tensor], b: int, at: slice, hs: slice,
          rows: slice) -> Optional[torch.Tensor]:
    """Where a block's [head, row, key] values go: its part of a buffer slot [1, position in the recorded heads, query,
    key] (indexed by `at`), else of a full [batch, head, query, key] tensor (indexed by b and the model heads `hs`),
    else None."""
    if slot is not None:
        return slot[0, at, rows]
    return None if full is None else full[b, hs, rows]


def seen_keys(mask: torch.Tensor) -> int:
    """The last key any row of mask [..., rows, K] (additive float, 0 = visible, or bool) lets through, + 1: the keys
    past it are hidden from every row (K when no key is visible: such rows keep every key, as without this)."""
    vis = visible_from_mask(mask, 0, 0).reshape(-1, mask.shape[-1]).any(0)               # [K]
    return int(last_visible(vis)) or vis.shape[0]


def first_seen_key(mask: torch.Tensor) -> int:
    """The first key any row of mask [..., rows, K] (additive float, 0 = visible, or bool) lets through: the keys
    before it are hidden from every row (a sliding-window layer's block of rows sees a band); 0 when no key is
    visible."""
    vis = visible_from_mask(mask, 0, 0).reshape(-1, mask.shape[-1]).any(0)               # [K]
    return int(vis.view(torch.uint8).argmax()) if bool(vis.any()) else 0


def _pick(mask: Optional[torch.Tensor], b: int, heads: slice, rows: slice) -> Optional[torch.Tensor]:
    """mask [batch|1, head|1, query|1, key] -> the [head|1, query rows|1, key] part for batch b, `heads`, `rows`."""
    if mask is None:
        return None
    m = mask[min(b, mask.shape[0] - 1)]
    m = m if m.shape[0] == 1 else m[heads]
    return m if m.shape[1] == 1 else m[:, rows]


def _record(state, layer, query, key, value, scores, probs, attention_mask, direct: bool):
    heads = state.heads
    pick = (lambda t: t[0].detach().float()) if heads is None else (lambda t: t[0, heads].detach().float())
    rec = state.records.setdefault(layer, {})
    for name, tensor in (("q", query), ("k", key), ("v", value)):
        if name in state.keep:
            rec[name] = pick(tensor).cpu()
    if "probs" in state.keep and not state.has_buffer("probs"):
        rec["probs"] = pick(probs).cpu()
    if "scores" in state.keep:
        visible = visible_from_mask(attention_mask, scores.shape[-2], scores.shape[-1])
        if direct:
            if not bool(visible.all()):
                scores.masked_fill_(~visible, float("-inf"))
        else:
            rec["scores"] = pick(scores.masked_fill(~visible, float("-inf"))).cpu()


def hidden_pre_hook(module, args, kwargs):
    """Forward pre-hook on attention modules: keeps the block's input hidden states [token, d_model]."""
    state: Optional[CaptureState] = getattr(module, "_attnlab", None)
    layer = getattr(module, "_attnlab_layer", None)
    if state is None or not state.recording or "hidden" not in state.keep:
        return None
    if state.layers is not None and layer not in state.layers:
        return None
    hidden = args[0] if args else kwargs.get("hidden_states")
    if hidden is not None:
        state.records.setdefault(layer, {})["hidden"] = hidden[0].detach().float().cpu()
    return None


def register() -> None:
    """Register the attention and mask functions with transformers (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(IMPLEMENTATION, attnlab_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


def stack_records(state: CaptureState, layers: list[int], keep) -> dict[str, torch.Tensor]:
    """Stack per-layer records into [layer, ...] tensors, in the order of `layers`."""
    out = {}
    for name in keep:
        if name in state.buffers:
            out[name] = state.buffers[name]
            continue
        missing = [l for l in layers if name not in state.records.get(l, {})]
        if missing:
            raise RuntimeError(
                f"no {name!r} recorded for layers {missing}: does the model use the attention interface?"
            )
        out[name] = torch.stack([state.records[l][name] for l in layers])
    return out


class StopCapture(Exception):
    """Raised by the attention function after the last recorded layer; `AttnModel.capture` catches it."""


# --------------------------------------------------------------------------- reusing a native pass's layers

@dataclass(frozen=True)
class LayerOutputs:
    """What every layer block returned in one native forward pass of `ids` [batch, token]
    (`AttnModel.layer_outputs`); `outputs[i]` is layer i's."""

    ids: torch.Tensor
    outputs: tuple


def find_blocks(hf: torch.nn.Module, attention_modules: Sequence[torch.nn.Module]) -> Optional[list]:
    """The layer blocks (items of a ModuleList, in layer order) holding each attention module, or None."""
    for ml in hf.modules():
        if isinstance(ml, torch.nn.ModuleList) and len(ml) == len(attention_modules):
            if all(any(m is a for m in block.modules()) for block, a in zip(ml, attention_modules)):
                return list(ml)
    return None


def detached(output):
    """A copy of a block's output (a tensor or a tuple of them) that later in-place operations cannot change."""
    if isinstance(output, torch.Tensor):
        return output.detach().clone()
    return tuple(detached(o) for o in output) if isinstance(output, tuple) else output


def _replay(output, *args, **kwargs):
    return detached(output)


@contextlib.contextmanager
def replaying(blocks: Sequence[torch.nn.Module], record: LayerOutputs, ids: torch.Tensor, upto: int):
    """Within the context, blocks 0..upto-1 return `record`'s outputs instead of computing them: exact
    when the pass runs `record.ids` with the native normalizer in those layers (checked by the caller)."""
    if not torch.equal(record.ids.cpu(), ids.cpu()):
        raise ValueError("reuse: the layer outputs were recorded for other token ids")
    saved = [block.__dict__.get("forward") for block in blocks[:upto]]
    for block, out in zip(blocks[:upto], record.outputs):
        block.forward = functools.partial(_replay, out)
    try:
        yield
    finally:
        for block, old in zip(blocks[:upto], saved):
            del block.forward
            if old is not None:
                block.forward = old
