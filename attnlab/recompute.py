"""Computing a stored Result again from its key alone (`core.cache.KEY_FILE`), for `attnlab results verify` /
`verify-results`: one function per recipe, named by each computation's `recompute` in `attnlab.computations`. Each
loads the model the key names and the text whose checksum it holds; None where the key does not say how."""
from __future__ import annotations

from attnlab.computations import COMPUTATIONS


def recompute(name: str, key: dict):
    """The Result stored as (name, key) computed again, or None: not declared in `attnlab.computations`, or its key
    does not say how."""
    c = COMPUTATIONS.get(name)
    return None if c is None or not c.recompute else globals()[f"_{c.recompute}"](key)


def _model(key: dict):
    from attnlab.core.models import load_model

    return load_model(key["model"], key.get("device", "cpu"))


def _corpus(sha256: str):
    """The corpus (`core.text.CORPORA`) whose checksum a key holds."""
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
    from attnlab.views import tokens

    entry = tokens.EXPERIMENTS.get(key.get("experiment"))
    return None if entry is None else tokens.recompute(entry[0], key)


def _tsc_real(key: dict):
    if "figure" in key:
        return _figure(key)
    from attnlab.sample_complexity import real_tokens

    return real_tokens.real_encoder(_model(key), device=key["device"], **key["params"])


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
    from attnlab.normalization import experiments

    if (key["fig1_version"], key["fig3_version"]) != (FIGURES["fig1"].version, FIGURES["fig3"].version):
        return None
    res = cached_figures(["fig1", "fig3"], _window_inputs(key))
    return experiments.separability_by_concentration(res["fig1"], res["fig3"])


def _fig2c_ratio(key: dict):
    from attnlab.normalization import experiments

    inp = _window_inputs(key)
    return experiments.fig2c_ratio(inp.model, inp.ids(), fracs=tuple(key["fracs"]), points=key["points"],
                                   progress=False)


def _sink_inputs(key: dict, max_length):
    """`views.sinks`' inputs of a sink Result's key: War and Peace from its start (None: another text)."""
    from attnlab.views import sinks as views

    inp = _window_inputs(dict(key, text_name="war_and_peace", text_start=0, max_length=None))
    return views._sharing(inp, max_length) if inp.corpus.sha256 == key["text"] else None


def _sink_shares(key: dict):
    from attnlab.tools import sinks
    from attnlab.views import sinks as views

    inp = _sink_inputs(key, None) if key["window"] == views.WINDOW else None
    if inp is None:
        return None
    ids = inp.ids(max(key["lengths"]))
    return sinks.sink_shares(inp.model, ids, lengths=key["lengths"], normalizer=key["normalizer"],
                             text=views._text(inp))


def _sink_claims(key: dict):
    from attnlab.figures import FIGURES, cached_figures
    from attnlab.tools import sinks
    from attnlab.views import sinks as views

    ok = key["window"] == views.WINDOW and key["fig3_version"] == FIGURES["fig3"].version
    inp = _sink_inputs(key, views.CLAIM_MAX_LENGTH) if ok else None
    if inp is None:
        return None
    fig3 = cached_figures(["fig3"], inp)["fig3"]
    return sinks.sink_claims(inp.model, inp.ids(), fig3=fig3, lengths=key["lengths"], text=views._text(inp))


def _compare(key: dict):
    from attnlab.tools import compare

    model, corpus = _model(key), _corpus(key["text"])
    if key.get("params") == "default":
        return compare.compare_normalizers(model, corpus, progress=False)
    if key.get("params") == "peers":
        return compare.compare_normalizers(model, corpus, lengths=key["lengths"], progress=False,
                                           specs=[compare.spec("softpick"), compare.spec("sigmoid")])
    return None


def _bench(key: dict):
    from attnlab import benchmarks

    return benchmarks.bench_normalizers(_model(key), _corpus(key["text"]), lengths=tuple(key["lengths"]),
                                        repeats=3, progress=False)


def _diagnose(key: dict):
    from attnlab.tools import diagnose

    if key.get("params") != "default":
        return None
    return diagnose.diagnose(_model(key), _corpus(key["text"]), progress=False)


