"""Writing a GGUF file from a tiny Llama, with the `gguf` package's GGUFWriter, for tests that need no download.

What transformers' GGUF reader needs from a "llama" file (transformers 5.x: `integrations/ggml.py`'s
GGUF_CONFIG_MAPPING["llama"] for the config, `modeling_gguf_pytorch_utils.load_gguf_checkpoint` for the
tensors, `integrations/gguf/gguf_tokenizer_mapping.py` for the tokenizer):

* metadata: general.architecture = "llama" (GGUFWriter writes it), llama.context_length,
  llama.embedding_length, llama.block_count, llama.feed_forward_length, llama.rope.dimension_count (read
  as head_dim), llama.rope.freq_base, llama.attention.head_count, llama.attention.head_count_kv,
  llama.attention.layer_norm_rms_epsilon, llama.vocab_size;
* tensors, under llama.cpp's names (token_embd, blk.N.attn_q ..., output_norm, output), each as the
  [out, in] numpy array of the Hugging Face weight; "output.weight" is left out when the embeddings are
  tied (the reader sets tie_word_embeddings from its absence);
* attn_q / attn_k permuted the way llama.cpp's convert_hf_to_gguf.py permutes them (`permute_for_gguf`):
  Hugging Face's RoPE rotates the two halves of a head (rotate_half), llama.cpp's rotates adjacent pairs,
  so each head's rows are reordered; LlamaTensorProcessor._reverse_permute_weights undoes it on load.
  attn_k is permuted per key/value head (head_count_kv), not per query head;
* a tokenizer: tokenizer.ggml.model = "gpt2" (byte-level BPE) with tokens (spelled in GPT-2's byte
  alphabet), token_type (1 normal, 3 control) and merges ("left right"), plus bos/eos ids.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

ENDOFTEXT = "<|endoftext|>"
NORMAL, CONTROL = 1, 3              # llama.cpp's token types
# the words the tiny vocabulary merges whole (a leading space is part of a GPT-2 word)
# (" the" before "the": the merge "Ġ t" must outrank "t h", or " the" would become "Ġ" + "the")
TINY_WORDS = (" the", " attention", " of", " a", " head", " is", " softmax", " its", " scores", " query", " key",
              " value", " model", " token", "the", "ing")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: every byte as one printable character (printable ASCII stays itself)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def tiny_bpe(words=TINY_WORDS) -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token_types) of a small byte-level BPE: the 256 bytes, one chain of merges per
    word (left to right, so each word becomes one token), then <|endoftext|> as a control token."""
    spell = bytes_to_unicode()
    tokens = [spell[b] for b in range(256)]
    merges: list[str] = []
    known = set(tokens)
    for word in words:
        chars = [spell[b] for b in word.encode("utf-8")]
        left = chars[0]
        for right in chars[1:]:
            merged = left + right
            if merged not in known:
                merges.append(f"{left} {right}")
                tokens.append(merged)
                known.add(merged)
            left = merged
    tokens.append(ENDOFTEXT)
    return tokens, merges, [NORMAL] * (len(tokens) - 1) + [CONTROL]


TINY_VOCAB_SIZE = len(tiny_bpe()[0])


def reference_tokenizer(directory: Path):
    """The same BPE as a GPT2TokenizerFast from vocab.json + merges.txt written into `directory`."""
    import json

    from transformers import GPT2TokenizerFast

    tokens, merges, _ = tiny_bpe()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return GPT2TokenizerFast(vocab=str(directory / "vocab.json"), merges=str(directory / "merges.txt"),
                             bos_token=ENDOFTEXT, eos_token=ENDOFTEXT, unk_token=ENDOFTEXT)


def permute_for_gguf(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py): within each of the `n_head` heads, rows
    [x0..x(d/2-1), y0..y(d/2-1)] (rotate_half's halves) become [x0, y0, x1, y1, ...] (adjacent pairs)."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def _tensors(hf_model, permute: bool) -> list[tuple[str, np.ndarray]]:
    cfg = hf_model.config
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    sd = {k: v.detach().float().cpu().numpy() for k, v in hf_model.state_dict().items()}
    out = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if permute:
            q, k = permute_for_gguf(q, n_head), permute_for_gguf(k, n_kv)
        out += [(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"]),
                (f"blk.{i}.attn_q.weight", q),
                (f"blk.{i}.attn_k.weight", k),
                (f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"]),
                (f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"]),
                (f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"]),
                (f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"]),
                (f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"]),
                (f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])]
    out.append(("output_norm.weight", sd["model.norm.weight"]))
    if not cfg.tie_word_embeddings:
        out.append(("output.weight", sd["lm_head.weight"]))
    return out


def add_tiny_tokenizer(w, tokens: list[str], merges: list[str], types: list[int]) -> None:
    """The tiny byte-level BPE (`tiny_bpe`) as a GGUF "gpt2" tokenizer, <|endoftext|> as bos and eos."""
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index(ENDOFTEXT))
    w.add_eos_token_id(tokens.index(ENDOFTEXT))


def write_tiny_gguf(path, hf_model, tokenizer_kind: str = "gpt2", *, dtype: str = "f32", permute: bool = True,
                    name: Optional[str] = "tiny-llama", metadata: Optional[dict] = None) -> Path:
    """Write `hf_model` (a LlamaForCausalLM, no attention/MLP biases) as a "llama" GGUF file at `path`.

    tokenizer_kind: "gpt2" (the byte-level BPE of `tiny_bpe`; the model's vocab_size must be
    TINY_VOCAB_SIZE). dtype: "f32" or "f16" (matrices only; norms stay f32, as llama.cpp keeps them).
    permute=False skips llama.cpp's q/k permutation: a wrong file, for tests that must see it fail.
    metadata: {"attention.head_count": 0, "block_count": None, ...}: a value that replaces the one written under
    "llama.<key>", None to leave the key out (a broken file, for tests that must see it refused).
    """
    from gguf import GGUFWriter

    if tokenizer_kind != "gpt2":
        raise ValueError(f"tokenizer_kind must be 'gpt2', got {tokenizer_kind!r}")
    if dtype not in ("f32", "f16"):
        raise ValueError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    cfg = hf_model.config
    if cfg.model_type != "llama":
        raise ValueError(f"a LlamaForCausalLM is needed, got model_type {cfg.model_type!r}")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise ValueError("biases are not written: use attention_bias=False, mlp_bias=False")
    tokens, merges, types = tiny_bpe()
    if cfg.vocab_size != len(tokens):
        raise ValueError(f"the model's vocab_size is {cfg.vocab_size}; the tiny BPE has {len(tokens)} tokens "
                         "(build the model with vocab_size=TINY_VOCAB_SIZE)")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    if rope.get("rope_type", "default") != "default" or theta is None:
        raise ValueError(f"only plain RoPE is written, got {rope}")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arch = "llama"
    w = GGUFWriter(str(path), arch)               # writes general.architecture
    if name:
        w.add_name(name)
    w.add_file_type(0 if dtype == "f32" else 1)   # ALL_F32 / MOSTLY_F16
    fields = {"context_length": int(cfg.max_position_embeddings), "embedding_length": int(cfg.hidden_size),
              "block_count": int(cfg.num_hidden_layers), "feed_forward_length": int(cfg.intermediate_size),
              "rope.dimension_count": int(head_dim), "rope.freq_base": float(theta),
              "attention.head_count": int(cfg.num_attention_heads),
              "attention.head_count_kv": int(cfg.num_key_value_heads),
              "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), "vocab_size": len(tokens)}
    for key, value in {**fields, **(metadata or {})}.items():
        if value is not None:
            (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"{arch}.{key}", value)
    add_tiny_tokenizer(w, tokens, merges, types)
    for tensor_name, array in _tensors(hf_model, permute):
        array = np.ascontiguousarray(array, dtype=np.float16 if dtype == "f16" and array.ndim > 1 else np.float32)
        w.add_tensor(tensor_name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --------------------------------------------------------------------------- any family transformers' reader accepts

GGUF_ARCH = {"gemma3_text": "gemma3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss",
             "minimax_m2": "minimax-m2", "cohere": "command-r"}     # model type -> llama.cpp's architecture name


def _to_gguf(arch: str, gguf_name: str, array: np.ndarray, cfg) -> np.ndarray:
    """Undo what transformers' TensorProcessor for `arch` does on load (llama: the q/k permutation; gemma: norm
    weights stored + 1; gpt2: some matrices transposed), so that the file reads back as `array`."""
    if arch == "llama" and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
        heads = cfg.num_attention_heads if "attn_q" in gguf_name else cfg.num_key_value_heads
        return permute_for_gguf(array, heads)
    if arch in ("gemma2", "gemma3") and "norm.weight" in gguf_name:
        return array + 1
    if arch == "gpt2" and any(k in gguf_name for k in ("attn_qkv.weight", "ffn_down.weight", "ffn_up.weight",
                                                       "attn_output.weight")):
        return array.T
    return array


def write_family_gguf(path, hf_model, name: Optional[str] = None) -> Path:
    """Write any `hf_model` whose family transformers' GGUF reader accepts as a GGUF file at `path`: metadata from
    GGUF_CONFIG_MAPPING[arch] (each config field it reads), tensors under the names transformers' own
    `get_gguf_hf_weights_map` expects, the tiny BPE tokenizer (the model's vocab_size must be TINY_VOCAB_SIZE)."""
    from gguf import GGUFWriter
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    cfg = hf_model.config
    arch = GGUF_ARCH.get(cfg.model_type, cfg.model_type)
    config_arch = cfg.model_type if cfg.model_type in GGUF_CONFIG_MAPPING else arch
    tokens, merges, types = tiny_bpe()
    if cfg.vocab_size != len(tokens):
        raise ValueError(f"vocab_size must be TINY_VOCAB_SIZE ({len(tokens)}), got {cfg.vocab_size}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), arch)
    w.add_name(name or f"tiny-{arch}")
    w.add_file_type(0)
    for key, attr in GGUF_CONFIG_MAPPING[config_arch].items():
        value = getattr(cfg, attr, None) if attr else None
        if attr == "rope_theta" and value is None:
            value = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
        if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
            continue
        (w.add_uint32 if isinstance(value, int) else w.add_float32)(f"{arch}.{key}", value)
    add_tiny_tokenizer(w, tokens, merges, types)
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=cfg.to_dict())
    state = {k: v.detach().float().cpu().numpy() for k, v in hf_model.state_dict().items()}
    for gguf_name, hf_name in get_gguf_hf_weights_map(hf_model, processor).items():
        if hf_name not in state or (gguf_name == "output.weight" and getattr(cfg, "tie_word_embeddings", False)):
            continue
        w.add_tensor(gguf_name, np.ascontiguousarray(_to_gguf(arch, gguf_name, state[hf_name], cfg), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
