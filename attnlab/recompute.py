"""The recipes: how each computation of `attnlab.computations` is computed from its key, one function per recipe
(named by the computation's `recompute`). Two callers share them: `result` (here, and as `attnlab.results.result`: a
chapter or the CLI asks for a Result by name and key, with the model and text it has loaded: `model`, `corpus`) and
`attnlab results verify` / `verify-results` (a stored Result computed again from its key alone, `core.cache.KEY_FILE`:
the recipe loads the model the key names and the text whose checksum it holds). None where the key does not say how.
"""
from __future__ import annotations

from typing import Optional

from attnlab.computations import COMPUTATIONS
from attnlab.core.result import Result


def recompute(name: str, key: dict, model=None, corpus=None):
    """The Result (name, key) computed by its recipe, or None: not declared in `attnlab.computations`, or its key
    does not say how. `model`, `corpus`: the loaded model and text the key names (None: loaded from the key)."""
    c = COMPUTATIONS.get(name)
    if c is None or not c.recompute:
        return None
    recipe = globals()[f"_{c.recompute}"]
    return recipe(key, model, corpus) if c.recompute in WITH_LOADED else recipe(key)


def full_key(key: dict, model=None, corpus=None) -> dict:
    """`key` with the model's name and identity and the text's checksum added (the parts they name)."""
    from attnlab.core.cache import model_key

    out = dict(key)
    if model is not None:
        out.update(model_key(model))
    if corpus is not None:
        out["text"] = corpus.sha256
    return out


def result(name: str, key: dict, *, model=None, corpus=None, refresh: bool = False,
           text_sha256: Optional[str] = None) -> Result:
    """The Result `name` for `key` (+ `model`, `corpus`) from the results cache, else computed by its recipe and
    stored. ValueError when `name` has no recipe in the registry (`attnlab results list` says which do) or the
    recipe does not know the key (a "params" it has no recipe for). `text_sha256`: the text's checksum when no
    corpus object is at hand."""
    from attnlab.core.cache import cached

    c = COMPUTATIONS.get(name)
    if c is None or not c.recompute:
        known = ", ".join(n for n, x in COMPUTATIONS.items() if x.recompute)
        raise ValueError(f"{name!r} has no recipe in attnlab/computations.py; these do: {known}")
    full = full_key(key, model, corpus)
    if text_sha256 is not None:
        full["text"] = text_sha256

    def compute() -> Result:
        out = recompute(name, full, model, corpus)
        if out is None:
            raise ValueError(f"{name}: its recipe ({c.recompute}) does not know the key {key}")
        return out

    return cached(name, full, compute, refresh=refresh)


# the recipes that take the model and text a caller has loaded (`result`)
WITH_LOADED = ("tsc_real", "compare", "compare_each", "bench", "diagnose", "layer_kinds", "critical_by_kind")


def _model(key: dict, model=None):
    """`model`, else the model the key names."""
    if model is not None:
        return model
    from attnlab.core.models import load_model

    return load_model(key["model"], key.get("device", "cpu"))


def _corpus(sha256: str, corpus=None):
    """`corpus`, else the corpus (`core.text.CORPORA`) whose checksum a key holds."""
    if corpus is not None:
        return corpus
    from attnlab.core.text import CORPORA, load_corpus

    for name in CORPORA:
        corpus = load_corpus(name, allow_download=False)
        if corpus.sha256 == sha256:
            return corpus
    raise ValueError(f"no corpus has the checksum {sha256[:12]}...")


def _window_inputs(key: dict):
    """`figures.Inputs` of the window a `figures.Inputs.window_key` names."""
    from attnlab.figures import Inputs

    return Inputs(key["model"], key["device"], text=key["text_name"], max_length=key["max_length"],
                  start=key["text_start"])


def _windows(pairs) -> list:
    """The `windows.TextWindow`s of (corpus, start) pairs: of the book's windows, else of `attnlab check --windows
    K`'s for the smallest K (up to 32) that has them all."""
    from attnlab import windows

    for k in (windows.BOOK_WINDOWS, *range(1, 33)):
        known = {(w.corpus, w.start): w for w in windows.text_windows(k)}
        if all((c, s) in known for c, s in pairs):
            return [known[(c, s)] for c, s in pairs]
    raise ValueError(f"no text windows start at {pairs}")


def _figure(key: dict):
    from attnlab import figures

    return figures.recompute(key.get("figure", ""), key) if "figure" in key else _experiment(key)


def _experiment(key: dict):
    """Chapter 9's experiments (`views.tokens.run`): the registry's function named by key["experiment"], called with
    the key's device and parameters."""
    import importlib

    wanted = [c.compute for c in COMPUTATIONS.values() if c.compute.endswith(f":{key.get('experiment')}")]
    if len(wanted) != 1 or not {"params", "device"} <= set(key):
        return None
    module, fn = wanted[0].split(":")
    return getattr(importlib.import_module(module), fn)(device=key["device"], **key["params"])


def _tsc_real(key: dict, model=None, corpus=None):
    """`real_tokens.real_encoder` with the key's explicit parameters (`real_tokens.real_params`): the figure's
    and chapter 10's one recipe."""
    from attnlab.sample_complexity import real_tokens

    return real_tokens.real_encoder(_model(key, model), device=key["device"], **key["params"])


def _authors_sphere(key: dict):
    from attnlab.sample_complexity import sphere

    return sphere.authors_sphere_reference() if key.get("preset") == "default" else None


def _perplexity(key: dict):
    from attnlab.core.perplexity import perplexity

    options = {k: v for k, v in key.items() if k not in ("experiment", "model", "identity", "text", "version",
                                                         "environment")}
    return perplexity(_model(key), _corpus(key["text"]), **options)


def _pooled_ks(key: dict):
    from attnlab import windows
    from attnlab.core.result import Result

    return Result("pooled_ks", windows.pooled_critical_n(key["model"], _windows(key["windows"]), key["lengths"],
                                                         max_length=key["max_length"], progress=False))


def _reading_windows(key: dict):
    from attnlab import windows
    from attnlab.core.result import Result

    return Result("reading_windows", windows.reading_critical_over_windows(
        key["model"], _windows(key["windows"]), key["reading"], lengths=key["lengths"]))


def _fig4_without_repeats(key: dict):
    from attnlab import windows

    w = _windows([key["window"]])[0]
    return windows.fig4_without_repeats(windows.window_inputs(key["model"], "cpu", [w], key["max_length"])[0])


def _head_separability(key: dict):
    from attnlab.figures import FIGURES, cached_figures
    from attnlab.normalization import concentration

    if (key["fig1_version"], key["fig3_version"]) != (FIGURES["fig1"].version, FIGURES["fig3"].version):
        return None
    res = cached_figures(["fig1", "fig3"], _window_inputs(key))
    return concentration.separability_by_concentration(res["fig1"], res["fig3"])


def _fig2c_ratio(key: dict):
    from attnlab.normalization import experiments

    inp = _window_inputs(key)
    return experiments.fig2c_ratio(inp.model, inp.ids(), fracs=tuple(key["fracs"]), points=key["points"],
                                   progress=False)


def _sink_inputs(key: dict, max_length):
    """The inputs of a sink Result's key: War and Peace from its start, L up to `max_length` (None: another text)."""
    inp = _window_inputs(dict(key, text_name="war_and_peace", text_start=0, max_length=max_length))
    return inp if inp.corpus.sha256 == key["text"] else None


def _sink_shares(key: dict):
    from attnlab.tools import sinks

    inp = _sink_inputs(key, None) if key["window"] == sinks.BOOK_WINDOW else None
    if inp is None:
        return None
    ids = inp.ids(max(key["lengths"]))
    return sinks.sink_shares(inp.model, ids, lengths=key["lengths"], normalizer=key["normalizer"],
                             text=sinks.window_text(inp.corpus))


def _sink_claims(key: dict):
    from attnlab.figures import FIGURES, cached_figures
    from attnlab.tools import sinks

    ok = key["window"] == sinks.BOOK_WINDOW and key["fig3_version"] == FIGURES["fig3"].version
    inp = _sink_inputs(key, sinks.CLAIM_MAX_LENGTH) if ok else None
    if inp is None:
        return None
    fig3 = cached_figures(["fig3"], inp)["fig3"]
    return sinks.sink_claims(inp.model, inp.ids(), fig3=fig3, lengths=key["lengths"],
                             text=sinks.window_text(inp.corpus))


def _sink_window(key: dict, model=None, corpus=None):
    """(model, ids, text provenance) of the book's sink window (War and Peace from its start, BOS first where the
    model table says bos), max(key["lengths"]) tokens; None where the key names another window or text."""
    from attnlab.tools import sinks

    if key.get("window") != sinks.BOOK_WINDOW:
        return None
    model, corpus = _model(key, model), _corpus(key["text"], corpus)
    if corpus.name != "war_and_peace":
        return None
    return model, model.window(corpus.text, max(key["lengths"])), sinks.window_text(corpus)


def _layer_kinds(key: dict, model=None, corpus=None):
    """Vanishing attention by layer kind on the book's sink window (`_sink_window`), L = key["lengths"]."""
    from attnlab.normalization.layer_kinds import layer_kind_rows

    window = _sink_window(key, model, corpus)
    if window is None:
        return None
    model, ids, text = window
    return layer_kind_rows(model, ids, lengths=key["lengths"], text=text)


def _critical_by_kind(key: dict, model=None, corpus=None):
    """The critical N of each layer kind on the book's sink window (`_sink_window`), L = key["lengths"], `max_rows`
    rows per head, the grid in steps of `step_frac` up to `max_frac` of a kind's longest row."""
    from attnlab.tools.critical_by_kind import critical_by_kind

    window = _sink_window(key, model, corpus)
    if window is None:
        return None
    model, ids, text = window
    return critical_by_kind(model, ids, lengths=key["lengths"], max_rows=key["max_rows"],
                            crit_max_frac=key["max_frac"], crit_step_frac=key["step_frac"], text=text)


def _compare(key: dict, model=None, corpus=None):
    """Chapter 7's comparison: "default" (every normalizer at the default lengths) or "peers" (softpick and
    sigmoid at the key's lengths)."""
    from attnlab.tools import compare

    model, corpus = _model(key, model), _corpus(key["text"], corpus)
    if key.get("params") == "default":
        return compare.compare_normalizers(model, corpus, progress=False)
    if key.get("params") == "peers":
        return compare.compare_normalizers(model, corpus, lengths=key["lengths"], progress=False,
                                           specs=[compare.spec("softpick"), compare.spec("sigmoid")])
    return None


def _compare_each(key: dict, model=None, corpus=None):
    """Chapter 7's one-layer-at-a-time swap at L = key["L"]: the default normalizers named by key["specs"], SSMax's
    reference length key["ssmax_ref_length"]."""
    from attnlab.tools import compare

    specs = [s for s in compare.default_specs(key["ssmax_ref_length"]) if s.label in key["specs"]]
    if [s.label for s in specs] != list(key["specs"]):
        return None
    return compare.compare_normalizers(_model(key, model), _corpus(key["text"], corpus), lengths=[key["L"]],
                                       specs=specs, swap="each", ssmax_ref_length=key["ssmax_ref_length"],
                                       progress=False)


def _bench(key: dict, model=None, corpus=None):
    from attnlab import benchmarks

    return benchmarks.bench_normalizers(_model(key, model), _corpus(key["text"], corpus),
                                        lengths=tuple(key["lengths"]), repeats=3, progress=False)


def _diagnose(key: dict, model=None, corpus=None):
    from attnlab.tools import diagnose

    if key.get("params") != "default":
        return None
    return diagnose.diagnose(_model(key, model), _corpus(key["text"], corpus), progress=False)
