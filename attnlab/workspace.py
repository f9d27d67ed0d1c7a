"""The workspace of a run: which model, device, text window and thread count, and the model, tokenizer (the model's
own) and corpus loaded once, lazily, then passed down to every figure, chapter and view that needs them.

    ws = Workspace("smollm2", "cpu")                       # loads nothing yet
    ids = ws.ids()                                         # loads the model and War and Peace, once
    other = ws.with_window(start=9000, max_length=512)     # the same loaded model and text, another window
    ws = Workspace.around(model)                           # a model already loaded (tests, notebooks)

`figures.Inputs` is this class under its older name.
"""
from __future__ import annotations

from typing import Optional

#: `with_window`'s marker for "keep this workspace's value" (None is a value: max_length None is the paper's 1024)
_SAME = object()
#: {(name asked, device): AttnModel} loaded in this process once `share_models()` was called; None: off
_SHARED: Optional[dict] = None


def share_models() -> None:
    """From now on every workspace of this process loads each model once (by the name asked, and by the loaded
    model's own name: "auto" then "smollm2" is one load). The book's chapters turn it on (`book.inputs`): a chapter
    reached SmolLM2 through four workspaces (its own, the windows' claims, a figure's key, its trace), each loading
    and verifying the de-quantized copy again. Off by default: elsewhere two loads give two models."""
    global _SHARED
    if _SHARED is None:
        _SHARED = {}


def _load(name: str, device: str):
    """`core.models.load_model(name, device)` (a model table GGUF model: its `DeferredModel`, de-quantized only when
    more than its name and identity is asked), or the model loaded before under that name (`share_models`)."""
    from attnlab.core.models import DeferredModel, deferred_model, load_model

    if _SHARED is None:
        return deferred_model(name, device) or load_model(name, device)
    if (name, device) not in _SHARED:
        model = deferred_model(name, device) or load_model(name, device)
        known = _SHARED.setdefault((model.name, device), model)
        if isinstance(known, DeferredModel) and known._model is None and not isinstance(model, DeferredModel):
            known.adopt(model)              # "auto" loaded it: the deferred one asked before need not load it again
        _SHARED[(name, device)] = known
    return _SHARED[(name, device)]


class Workspace:
    """Model name, device, text name, the window's first character (`start`) and longest length (`max_length`),
    and the torch thread count (`threads`, None: the CPUs free now, `core.util.auto_threads`); the model, its
    corpus and encoder loaded once, on first use, and shared by every sibling `with_window` derives."""

    def __init__(self, model: str, device: str, text: str = "war_and_peace", max_length: Optional[int] = None,
                 start: int = 0, *, threads: Optional[int] = None):
        from attnlab.core.util import check_device, check_int, check_max_length

        self.model_name, self.device, self.text_name = model, check_device(device), text
        # the longest window of the paper-1 figures (None: 1024; at least the grid's first length, 32)
        self.max_length = check_max_length(max_length, "figures")
        self.start = check_int(start, "start", low=0)   # the window's first character in the corpus's text
        self.threads = None if threads is None else check_int(threads, "--threads", low=1)
        self._loaded = {}                               # "model", "corpus", "encoder": loaded once, shared

    @classmethod
    def around(cls, model, device: str = "cpu", **window) -> "Workspace":
        """A workspace holding `model`, an `AttnModel` already loaded (its name: `model.name`); `window`: text,
        max_length, start, threads as in the constructor."""
        ws = cls(model.name, device, **window)
        ws._loaded["model"] = model
        return ws

    def with_window(self, *, text: str = None, start: int = None, max_length=_SAME) -> "Workspace":
        """A sibling workspace on another window (`text`, `start`, `max_length`; None or absent: this one's, except
        max_length, where None is the paper's 1024): same model name, device and threads, and the model (and the
        corpus, when the text is the same) already loaded here shared, not loaded again."""
        text = self.text_name if text is None else text
        out = type(self)(self.model_name, self.device, text=text,
                         max_length=self.max_length if max_length is _SAME else max_length,
                         start=self.start if start is None else start, threads=self.threads)
        same_text = text == self.text_name
        out._loaded = {k: v for k, v in self._loaded.items() if k != "corpus" or same_text}
        return out

    def _get(self, what: str, load):
        if what not in self._loaded:
            self._loaded[what] = load()
        return self._loaded[what]

    @property
    def model(self):
        """The `AttnModel` (its tokenizer: `model.window`), loaded on first use."""
        return self._get("model", lambda: _load(self.model_name, self.device))

    @property
    def corpus(self):
        """The text's `Corpus`, read on first use."""
        from attnlab.core.text import load_corpus

        return self._get("corpus", lambda: load_corpus(self.text_name))

    @property
    def encoder(self):
        """The model itself when it is an encoder; else MiniLM (the sample-complexity protocol is an encoder's)."""
        return self._get("encoder", lambda: self.model if not self.model.causal else _load("minilm", self.device))

    @property
    def window_length(self) -> int:
        """L of the largest window the figures use: `max_length` (the paper's 1024 when None), at most the model's
        positions (loads the model)."""
        return min(self.model.max_positions, self.max_length or 1024)

    def window_key(self) -> dict:
        """The window a chapter's own Result is computed on, as its cache key names it (`book.cached_result`): device,
        the text, its first character and the window's length (`window_length`; loads the model)."""
        return {"device": self.device, "max_length": self.window_length, "text_name": self.text_name,
                "text_start": self.start}

    def ids(self, length: Optional[int] = None):
        """Token ids [L] of the largest window the figures use (`window_length`), or of the first `length` tokens."""
        L = length or self.window_length
        if self.max_length is not None and self.max_length > self.model.max_positions:
            raise ValueError(f"--max-length {self.max_length} exceeds {self.model.name}'s {self.model.max_positions} "
                             "positions")
        return self.model.window(self.corpus.text[self.start:], L)

    def thread_count(self):
        """Context manager: torch threads = `threads` inside (`core.util.threads`; None: unchanged, each experiment
        then picks the CPUs free now)."""
        from attnlab.core.util import threads

        return threads(self.threads)
