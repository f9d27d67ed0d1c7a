"""Which architectures attnlab measures exactly: every causal-LM and text-encoder family of the installed
transformers, built tiny and random, captured, and compared with the model's own eager attention.

`matrix()` -> one dict per family: family, kind (the auto mapping it came from), status ("exact", "refused",
"skipped", "differs"), why, causal (the attention direction attnlab read from the model's mask when it loaded it,
`AttnModel.causal`; None where it never loaded), the features exercised (GQA, sliding window, QK-norm, softcap,
sinks) and the largest differences measured.
"""
from __future__ import annotations

import contextlib
import io
import warnings

import torch

TOL = 1e-6                 # float32: captured probs and outputs against eager, max abs difference
N_TOKENS = 12              # longer than SLIDING_WINDOW, so that the window cuts
SLIDING_WINDOW = 4
SOFTCAP = 0.02             # below the tiny models' scores, so that a capture without softcapping differs
VOCAB = 256
# size fields shrunk wherever a config has them (names differ between families); other fields keep defaults
TINY = {"hidden_size": 64, "n_embd": 64, "d_model": 64, "dim": 64, "embedding_size": 64, "embed_dim": 64,
        "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2,
        "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "n_heads": 4,
        "num_key_value_heads": 2, "n_kv_heads": 2, "num_kv_heads": 2, "multi_query_group_num": 2,
        "head_dim": 16, "kv_channels": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "ffn_hidden_size": 128, "d_ff": 128,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
        "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1,
        "topk_group": 1,
        "vocab_size": VOCAB, "max_position_embeddings": 128, "n_positions": 128,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        "attention_dropout": 0.0, "attn_pdrop": 0.0, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0, "sliding_window": SLIDING_WINDOW, "use_sliding_window": True,
        "attn_logit_softcapping": SOFTCAP}


def families() -> list[tuple[str, str, str]]:
    """(model type, class name, kind) from transformers' auto mappings: every causal-LM family ("causal"), and every
    masked-LM family without a causal LM ("encoder", its base model from MODEL_MAPPING_NAMES), sorted."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_MAPPING_NAMES,
    )

    rows = [(t, c, "causal") for t, c in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()]
    rows += [(t, MODEL_MAPPING_NAMES[t], "encoder") for t in MODEL_FOR_MASKED_LM_MAPPING_NAMES
             if t not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and t in MODEL_MAPPING_NAMES]
    return sorted(rows)


def tiny_config(family: str):
    """The family's config with every TINY field it has (fields whose default is None stay None, except
    softcapping and the window, which are switched on), float32, eager attention."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(family)
    if getattr(default, "sub_configs", None) and any(getattr(default, k, None) is not None
                                                     for k in default.sub_configs):
        raise ValueError("composite config (sub-configs: " + ", ".join(sorted(default.sub_configs)) + ")")
    fields = {k: v for k, v in TINY.items() if hasattr(default, k)}
    if "qk_rope_head_dim" in fields:      # latent attention (MLA): RoPE spans qk_rope_head_dim, a key per query head
        fields.update({k: v for k, v in (("head_dim", TINY["qk_rope_head_dim"]),
                                         ("num_key_value_heads", TINY["num_attention_heads"])) if k in fields})
    if getattr(default, "layer_types", None):           # two layers, of the first two kinds (sliding, full, ...)
        fields["layer_types"] = (list(dict.fromkeys(default.layer_types)) * 2)[:2]
    cfg = AutoConfig.for_model(family, **fields)
    cfg._attn_implementation = "eager"
    return cfg


def features(hf, seen: dict) -> dict:
    """The attention features a built model exercises (bools): GQA (fewer key than query heads), sliding window,
    softcap, sinks (keywords its eager attention received, `seen` by `spying`; sinks also as a parameter the
    attention reads itself), QK-norm (a q/k norm module)."""
    names = [n.rsplit(".", 1)[-1] for n, _ in hf.named_modules()]
    return {"gqa": seen["gqa"], "sliding_window": "sliding_window" in seen["keywords"],
            "qk_norm": any(n in ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_layernorm",
                                 "key_layernorm") for n in names),
            "softcap": "softcap" in seen["keywords"],
            "sinks": bool({"s_aux", "sinks"} & seen["keywords"]) or any(n.endswith("sinks")
                                                                        for n, _ in hf.named_parameters())}


@contextlib.contextmanager
def spying(hf):
    """Within the context, the eager attention function of `hf`'s modeling file records into the yielded dict
    "keywords" (names passed with a value) and "gqa" (fewer key/value heads than query heads)."""
    import sys

    module = sys.modules[type(hf).__module__]
    original = getattr(module, "eager_attention_forward", None)
    seen = {"keywords": set(), "gqa": False}

    def spy(mod, query, key, value, attention_mask, *args, **kwargs):
        seen["keywords"] |= {k for k, v in kwargs.items() if v is not None}
        seen["gqa"] |= key.shape[1] < query.shape[1]
        return original(mod, query, key, value, attention_mask, *args, **kwargs)

    if original is not None:
        module.eager_attention_forward = spy
    try:
        yield seen
    finally:
        if original is not None:
            module.eager_attention_forward = original


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text[:160]


def check_family(family: str, class_name: str, kind: str, seed: int = 0) -> dict:
    """One row of the matrix: build `class_name` tiny (seeded, float32, eval), run it eagerly with output_attentions,
    then through attnlab (load-time checks, capture of scores and probs, the output while recording)."""
    import transformers

    from attnlab.core.capture import UnsupportedAttention
    from attnlab.core.models import AttnModel

    row = {"family": family, "kind": kind, "class": class_name, "status": "skipped", "why": "", "causal": None,
           "gqa": False, "sliding_window": False, "qk_norm": False, "softcap": False, "sinks": False,
           "probs_diff": None, "output_diff": None}
    try:
        cfg = tiny_config(family)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            hf = getattr(transformers, class_name)(cfg).float().eval()
    except Exception as exc:  # noqa: BLE001 - any failure to build: reported as the row's reason
        return dict(row, why=f"cannot be built tiny ({_first_line(exc)})")
    ids = torch.randint(3, VOCAB, (1, N_TOKENS), generator=torch.Generator().manual_seed(seed))
    try:
        with torch.no_grad(), spying(hf) as seen:
            ref = hf(input_ids=ids, output_attentions=True)
    except Exception as exc:  # noqa: BLE001
        return dict(row, why=f"input_ids alone do not run it ({_first_line(exc)})")
    row.update(features(hf, seen))
    ref_out, ref_att = _output(ref), getattr(ref, "attentions", None)
    if ref_att is None or any(a is None for a in ref_att):
        return dict(row, why="its eager pass returns no attention weights")
    try:
        model = AttnModel(family, hf, None, source=f"tiny random {class_name}", random_weights=True)
    except UnsupportedAttention as exc:
        return dict(row, status="refused", why=str(exc).split(": ", 1)[-1])
    except ValueError as exc:
        if "no attention layer called" in str(exc):
            return dict(row, status="refused", why="no AttentionInterface")
        return dict(row, status="refused", why=_first_line(exc))
    row["causal"] = model.causal               # BERT's LM head class is in the causal-LM mapping, yet bidirectional
    if model.n_layers != len(ref_att):
        return dict(row, why=f"{model.n_layers} of its {len(ref_att)} layers call the attention interface "
                    "(hybrid: the others are not softmax attention); not compared")
    try:
        trace, out = _capture_with_output(model, ids[0])
    except UnsupportedAttention as exc:
        return dict(row, status="refused", why=str(exc).split(": ", 1)[-1])
    except Exception as exc:  # noqa: BLE001 - attnlab's own pass failing is a difference, reported
        return dict(row, status="differs", why=f"capture failed ({_first_line(exc)})")
    probs_diff = max(float((trace.probs[i] - a[0]).abs().max()) for i, a in enumerate(ref_att))
    if not row["sinks"]:                                  # scores: the probs are their softmax
        probs_diff = max(probs_diff, float((torch.softmax(trace.scores, -1) - trace.probs).abs().max()))
    output_diff = float((out - ref_out).abs().max())
    exact = probs_diff <= TOL and output_diff <= TOL
    return dict(row, status="exact" if exact else "differs", probs_diff=probs_diff, output_diff=output_diff,
                why="" if exact else f"probs differ by {probs_diff:.1e}, output by {output_diff:.1e}")


def _output(out) -> torch.Tensor:
    """logits, else last hidden state, of a transformers output."""
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out.last_hidden_state


def _capture_with_output(model, ids: torch.Tensor):
    """(Trace of scores and probs of every layer, the model's output [1, token, ...]) from one pass that records:
    the pass a capture runs, not stopped after the last layer."""
    from attnlab.core import capture as cap
    from attnlab.core.capture import Trace

    st, layers = model.state, list(range(model.n_layers))
    st.start({"scores", "probs"}, layers, None)
    try:
        with torch.no_grad():
            out = _output(model.hf(input_ids=ids[None]))
    finally:
        st.recording = False
    tensors = cap.stack_records(st, layers, ["probs", "scores"])
    st.records, st.buffers = {}, {}
    trace = Trace(model.name, ids, layers, list(range(model.n_heads)), model.causal, 0.0, **tensors)
    return trace, out


def matrix(kinds: tuple[str, ...] = ("causal", "encoder")) -> list[dict]:
    """Every family of `families()` of these kinds, checked (`check_family`), transformers' warnings silenced."""
    from attnlab.core.models import quiet_transformers

    rows = []
    for family, class_name, kind in families():
        if kind not in kinds:
            continue
        with quiet_transformers(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            rows.append(check_family(family, class_name, kind))
    return rows


# --------------------------------------------------------------------------- the table users read

FEATURE_COLUMNS = (("gqa", "GQA"), ("sliding_window", "sliding window"), ("qk_norm", "QK-norm"),
                   ("softcap", "softcap"), ("sinks", "sinks"))
STATUS_ORDER = {"exact": 0, "refused": 1, "skipped": 2, "differs": 3}


def gguf_architectures() -> set[str]:
    """The architectures transformers' GGUF reader accepts (its GGUF_SUPPORTED_ARCHITECTURES, "general" and
    "tokenizer" left out)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}


def direction(row: dict) -> str:
    """A row's attention direction in words: "causal", "bidirectional", or "" where attnlab never loaded it."""
    return {True: "causal", False: "bidirectional", None: ""}[row["causal"]]


def table_markdown(rows: list[dict]) -> str:
    """A Markdown table of `matrix()` rows: exact families first, then refused, then skipped (each alphabetical);
    attention: `direction`; a feature is marked where the tiny model exercised it; GGUF: the GGUF reader accepts
    the family."""
    import transformers

    gguf = gguf_architectures()
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUS_ORDER}
    head = ["family", "attention", "attnlab", *[name for _, name in FEATURE_COLUMNS], "GGUF"]
    lines = [f"transformers {transformers.__version__}: {len(rows)} families, " +
             ", ".join(f"{n} {s}" for s, n in counts.items() if n) + ".", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (STATUS_ORDER[r["status"]], r["family"])):
        verdict = r["status"] + (f": {r['why']}" if r["why"] else "")
        cells = [f"`{r['family']}`", direction(r), verdict.replace("|", "\\|"),
                 *["yes" if r[key] else "" for key, _ in FEATURE_COLUMNS], "yes" if r["family"] in gguf else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
