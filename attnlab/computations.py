"""The one registry of computations: every Result the package, the CLI or a chapter stores in the results cache
(`core.cache`), declared once here with its name, version, the key parts it is computed from, where its code is,
its golden probes (tests/test_golden.py, tests/golden/<name>@v<version>[.<label>].json), its cost class and the
chapters that use it. `attnlab results list | verify | compute` read it; `core.cache.cached` (and so
`book.cached_result` and `figures.cached_figures`) takes a computation's version from here.

`recompute(key)` computes a stored Result again from its key (`core.cache.KEY_FILE`) alone, for `attnlab results
verify`: it loads the model the key names and the text whose checksum it holds. None: the key does not say how
(`compare_normalizers_each`: its SSMax reference length is the smallest L of another Result).

Importing this module is cheap (no torch): the compute functions are named by their dotted path and imported by
`recompute` only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

COSTS = ("seconds", "minutes", "hours")     # on the 2-core CPU at the book's inputs (a GPU: seconds for most)


@dataclass(frozen=True)
class Computation:
    name: str               # the Result's name and its cache name
    version: int            # of the numbers: bump it when they change (tests/test_golden.py), never for a refactor
    inputs: tuple           # the key parts it is computed from (besides version and environment: `core.cache`)
    compute: str            # "module:function" that computes it
    cost: str               # one of COSTS
    used_in: tuple          # chapters (book/<stem>.ipynb) and commands that read it
    declared: str           # the code that asks the cache for it
    probes: tuple = ("",)   # its golden probes' labels ("": the tiny one)
    recompute: Optional[Callable[[dict], object]] = None     # key -> Result (see the module doc)


# ------------------------------------------------------------------ recomputing a stored Result from its key


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


# ------------------------------------------------------------------ the registry

FIGURE_KEY = ("figure", "quick", "device", "model", "identity", "text_name", "text", "text_start", "max_length")
SYNTHETIC_KEY = ("figure", "quick", "device", "max_length", "text_name", "text_start")     # as figures._cache_key
EXPERIMENT_KEY = ("experiment", "params", "device")                                     # views.tokens.run
WINDOW_KEY = ("device", "model", "identity", "text", "text_name", "text_start", "max_length")   # Inputs.window_key
CHAPTER_KEY = ("device", "params", "model", "identity", "text")                         # chapters 7, 8
PAPER1 = ("01_vanishing", "02_distance_collapse", "03_six_percent", "04_separability", "05_gradients",
          "06_what_holds", "attnlab figures", "attnlab check")
REAL = ("", "minilm64")
_F = "attnlab/figures.py cached_figures"


def _c(name, version, inputs, compute, cost, used_in, declared, probes=("",), recompute=None) -> Computation:
    return Computation(name, version, tuple(inputs), compute, cost, tuple(used_in), declared, tuple(probes),
                       recompute)


COMPUTATIONS: dict[str, Computation] = {c.name: c for c in (
    # paper 1's figures (attnlab.figures.FIGURES; one shared forward pass per length)
    _c("fig1", 2, FIGURE_KEY, "attnlab.normalization.experiments:fig1", "minutes", PAPER1, _F, REAL, _figure),
    _c("fig2a", 2, FIGURE_KEY, "attnlab.normalization.experiments:fig2a", "minutes", PAPER1, _F, REAL, _figure),
    _c("fig2b", 2, FIGURE_KEY, "attnlab.normalization.experiments:fig2b", "minutes", PAPER1, _F, REAL, _figure),
    _c("fig2c", 1, FIGURE_KEY, "attnlab.normalization.experiments:fig2c", "minutes", PAPER1 + ("07_beyond_softmax",),
       _F, recompute=_figure),
    _c("fig3", 2, FIGURE_KEY, "attnlab.normalization.experiments:fig3", "minutes", PAPER1 + ("07_beyond_softmax",),
       _F, REAL, _figure),
    _c("fig4", 2, FIGURE_KEY, "attnlab.normalization.experiments:fig4", "minutes", PAPER1, _F, REAL, _figure),
    _c("thm1_readings", 2, FIGURE_KEY, "attnlab.normalization.readings.theorem1:thm1_readings", "minutes",
       ("02_distance_collapse", "03_six_percent", "06_what_holds", "attnlab check"), _F, recompute=_figure),
    _c("separability_readings", 2, FIGURE_KEY, "attnlab.normalization.readings.theorem2:separability_readings",
       "minutes", ("04_separability", "06_what_holds", "attnlab check"), _F, REAL, _figure),
    _c("gradient_readings", 1, FIGURE_KEY, "attnlab.normalization.readings.lemma2:gradient_readings", "minutes",
       ("05_gradients", "06_what_holds", "11_conclusion", "attnlab check"), _F, recompute=_figure),
    # paper 2's figures, also chapter 9's experiments (attnlab.views.tokens.EXPERIMENTS: another key)
    _c("tsc_uniform", 1, SYNTHETIC_KEY + EXPERIMENT_KEY, "attnlab.sample_complexity.experiments:uniform_map",
       "minutes", ("09_infinite_tokens", "attnlab figures", "attnlab check"),
       f"{_F}; attnlab/views/tokens.py run", recompute=_figure),
    _c("tsc_moments", 1, SYNTHETIC_KEY + EXPERIMENT_KEY, "attnlab.sample_complexity.experiments:moment_convergence",
       "minutes", ("09_infinite_tokens", "attnlab figures", "attnlab check"),
       f"{_F}; attnlab/views/tokens.py run", recompute=_figure),
    _c("tsc_hardmax", 1, SYNTHETIC_KEY + EXPERIMENT_KEY, "attnlab.sample_complexity.sphere:hardmax", "minutes",
       ("09_infinite_tokens", "attnlab figures", "attnlab check"), f"{_F}; attnlab/views/tokens.py run",
       recompute=_figure),
    # two recipes, one name: the figure (figures._cache_key) and chapter 10's (its params in the key)
    _c("tsc_real", 1, SYNTHETIC_KEY + EXPERIMENT_KEY + ("model", "identity", "text"),
       "attnlab.sample_complexity.real_tokens:real_encoder", "minutes",
       ("10_real_tokens", "attnlab figures", "attnlab check"), f"{_F}; book/10_real_tokens.ipynb cells 36106723, "
       "solution10-1", recompute=_tsc_real),
    _c("tsc_sample_reference_effect", 1, EXPERIMENT_KEY,
       "attnlab.sample_complexity.experiments:sample_reference_effect", "minutes", ("09_infinite_tokens",),
       "attnlab/views/tokens.py run", recompute=_experiment),
    _c("tsc_authors_sphere_reference", 1, ("preset", "device"),
       "attnlab.sample_complexity.sphere:authors_sphere_reference", "minutes", ("09_infinite_tokens",),
       "book/09_infinite_tokens.ipynb cell 710adfb4", recompute=_authors_sphere),
    # the package's own (cache.cached / book.cached_result in attnlab/)
    _c("perplexity", 1, ("experiment", "model", "identity", "text"), "attnlab.core.perplexity:perplexity",
       "seconds", ("every chapter's model note (book.model_admonition)", "attnlab info"),
       "attnlab/core/perplexity.py cached_perplexity", recompute=_perplexity),
    _c("pooled_ks", 1, ("windows", "lengths", "max_length", "model", "identity"),
       "attnlab.windows:pooled_critical_n", "minutes", ("03_six_percent",), "attnlab/windows.py pooled_result",
       recompute=_pooled_ks),
    _c("reading_windows", 1, ("reading", "windows", "lengths", "model", "identity"),
       "attnlab.windows:reading_critical_over_windows", "minutes", ("03_six_percent",),
       "attnlab/windows.py reading_result", recompute=_reading_windows),
    _c("fig4_without_repeats", 1, ("window", "max_length", "model", "identity"),
       "attnlab.windows:fig4_without_repeats", "seconds", ("05_gradients", "06_what_holds"),
       "attnlab/windows.py repeats_result", recompute=_fig4_without_repeats),
    _c("head_separability", 1, ("fig1_version", "fig3_version") + WINDOW_KEY,
       "attnlab.normalization.experiments:separability_by_concentration", "seconds",
       ("04_separability", "06_what_holds"), "attnlab/views/separability.py head_separability",
       recompute=_head_separability),
    _c("fig2c_ratio", 1, ("points", "fracs") + WINDOW_KEY, "attnlab.normalization.experiments:fig2c_ratio",
       "minutes", ("03_six_percent",), "attnlab/views/six_percent.py ratio_curve", recompute=_fig2c_ratio),
    _c("sink_shares", 1, ("window", "lengths", "normalizer", "device", "model", "identity", "text"),
       "attnlab.tools.sinks:sink_shares", "minutes", ("07_beyond_softmax",), "attnlab/views/sinks.py shares",
       recompute=_sink_shares),
    _c("sink_claims", 1, ("window", "lengths", "fig3_version", "device", "model", "identity", "text"),
       "attnlab.tools.sinks:sink_claims", "minutes", ("07_beyond_softmax",), "attnlab/views/sinks.py claims",
       recompute=_sink_claims),
    # the chapters' own (book.cached_result in a chapter's cells)
    _c("compare_normalizers", 1, CHAPTER_KEY + ("lengths",), "attnlab.tools.compare:compare_normalizers", "minutes",
       ("07_beyond_softmax",), "book/07_beyond_softmax.ipynb cells baa9369c, peers07-table", ("crit50",),
       recompute=_compare),
    _c("compare_normalizers_each", 1, ("device", "L", "specs", "model", "identity", "text"),
       "attnlab.tools.compare:compare_normalizers", "minutes", ("07_beyond_softmax",),
       "book/07_beyond_softmax.ipynb cell 98c26771"),
    _c("bench_normalizers", 1, ("device", "lengths", "model", "identity", "text"),
       "attnlab.benchmarks:bench_normalizers", "minutes", ("07_beyond_softmax",),
       "book/07_beyond_softmax.ipynb cell 5b27a72f", recompute=_bench),
    _c("diagnose", 1, CHAPTER_KEY, "attnlab.tools.diagnose:diagnose", "minutes", ("08_diagnose",),
       "book/08_diagnose.ipynb cell 8b431e04", recompute=_diagnose),
)}


def version(name: str) -> int:
    """The declared version of computation `name`. KeyError (naming this module) when it is not declared."""
    if name not in COMPUTATIONS:
        raise KeyError(f"{name!r} is not a computation of attnlab/computations.py: declare it there")
    return COMPUTATIONS[name].version


def recompute(name: str, key: dict):
    """The Result stored as (name, key) computed again (`Computation.recompute`), or None: not declared here, or
    its key does not say how."""
    c = COMPUTATIONS.get(name)
    return None if c is None or c.recompute is None else c.recompute(key)


def listing() -> list[dict]:
    """One plain dict per computation: name, version, inputs, compute, cost, probes, used_in, declared,
    recomputable."""
    return [{"name": c.name, "version": c.version, "inputs": list(c.inputs), "compute": c.compute, "cost": c.cost,
             "probes": [p or "tiny" for p in c.probes], "used_in": list(c.used_in), "declared": c.declared,
             "recomputable": c.recompute is not None} for c in COMPUTATIONS.values()]
