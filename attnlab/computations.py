"""The one registry of computations: every Result the package, the CLI or a chapter stores in the results cache
(`core.cache`), declared once here with its name, version, the key parts it is computed from, where its code is,
its golden probes (tests/test_golden.py, tests/golden/<name>@v<version>[.<label>].json), its cost class and the
chapters that use it. `attnlab results list | verify | compute` read it; `core.cache.cached` (and so
`book.cached_result` and `figures.cached_figures`) takes a computation's version from here.

`recompute` names the recipe of attnlab/recompute.py that computes a Result from its key: `attnlab.results.result`
(a chapter's `book.result`) computes with it on the model and text the caller loaded, `attnlab results verify`
computes a stored Result again from its key (`core.cache.KEY_FILE`) alone. Every computation has one.

This module imports nothing (the core's cache reads it, and the figures): functions are named, not imported.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    recompute: str = ""     # the function of attnlab/recompute.py: key -> Result ("": none, see the module doc)


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


def _c(name, version, inputs, compute, cost, used_in, declared, probes=("",), recompute="") -> Computation:
    return Computation(name, version, tuple(inputs), compute, cost, tuple(used_in), declared, tuple(probes),
                       recompute)


COMPUTATIONS: dict[str, Computation] = {c.name: c for c in (
    # paper 1's figures (attnlab.figures.FIGURES; one shared forward pass per length)
    _c("fig1", 2, FIGURE_KEY, "attnlab.normalization.experiments:fig1", "minutes", PAPER1, _F, REAL, "figure"),
    _c("fig2a", 2, FIGURE_KEY, "attnlab.normalization.experiments:fig2a", "minutes", PAPER1, _F, REAL, "figure"),
    _c("fig2b", 2, FIGURE_KEY, "attnlab.normalization.experiments:fig2b", "minutes", PAPER1, _F, REAL, "figure"),
    _c("fig2c", 1, FIGURE_KEY, "attnlab.normalization.experiments:fig2c", "minutes", PAPER1 + ("07_beyond_softmax",),
       _F, recompute="figure"),
    _c("fig3", 2, FIGURE_KEY, "attnlab.normalization.experiments:fig3", "minutes", PAPER1 + ("07_beyond_softmax",),
       _F, REAL, "figure"),
    _c("fig4", 2, FIGURE_KEY, "attnlab.normalization.experiments:fig4", "minutes", PAPER1, _F, REAL, "figure"),
    _c("thm1_readings", 2, FIGURE_KEY, "attnlab.normalization.readings.theorem1:thm1_readings", "minutes",
       ("02_distance_collapse", "03_six_percent", "06_what_holds", "attnlab check"), _F, recompute="figure"),
    _c("separability_readings", 2, FIGURE_KEY, "attnlab.normalization.readings.theorem2:separability_readings",
       "minutes", ("04_separability", "06_what_holds", "attnlab check"), _F, REAL, "figure"),
    _c("gradient_readings", 1, FIGURE_KEY, "attnlab.normalization.readings.lemma2:gradient_readings", "minutes",
       ("05_gradients", "06_what_holds", "11_conclusion", "attnlab check"), _F, recompute="figure"),
    # paper 2's figures, also chapter 9's experiments (attnlab.views.tokens.EXPERIMENTS: another key)
    _c("tsc_uniform", 1, SYNTHETIC_KEY + EXPERIMENT_KEY, "attnlab.sample_complexity.experiments:uniform_map",
       "minutes", ("09_infinite_tokens", "attnlab figures", "attnlab check"),
       f"{_F}; attnlab/views/tokens.py run", recompute="figure"),
    _c("tsc_moments", 1, SYNTHETIC_KEY + EXPERIMENT_KEY, "attnlab.sample_complexity.experiments:moment_convergence",
       "minutes", ("09_infinite_tokens", "attnlab figures", "attnlab check"),
       f"{_F}; attnlab/views/tokens.py run", recompute="figure"),
    _c("tsc_hardmax", 1, SYNTHETIC_KEY + EXPERIMENT_KEY, "attnlab.sample_complexity.sphere:hardmax", "minutes",
       ("09_infinite_tokens", "attnlab figures", "attnlab check"), f"{_F}; attnlab/views/tokens.py run",
       recompute="figure"),
    # one recipe: the figure (figures._cache_key) and chapter 10 key it alike (real_tokens.real_params)
    _c("tsc_real", 1, EXPERIMENT_KEY + ("model", "identity", "text"),
       "attnlab.sample_complexity.real_tokens:real_encoder", "minutes",
       ("10_real_tokens", "attnlab figures", "attnlab check"), f"{_F}; book/10_real_tokens.ipynb cells 36106723, "
       "solution10-1", recompute="tsc_real"),
    _c("tsc_sample_reference_effect", 1, EXPERIMENT_KEY,
       "attnlab.sample_complexity.experiments:sample_reference_effect", "minutes", ("09_infinite_tokens",),
       "attnlab/views/tokens.py run", recompute="experiment"),
    _c("tsc_authors_sphere_reference", 1, ("preset", "device"),
       "attnlab.sample_complexity.sphere:authors_sphere_reference", "minutes", ("09_infinite_tokens",),
       "attnlab/views/tokens.py authors_reference", recompute="authors_sphere"),
    # the package's own (cache.cached / book.cached_result in attnlab/)
    _c("perplexity", 1, ("experiment", "model", "identity", "text"), "attnlab.core.perplexity:perplexity",
       "seconds", ("every chapter's model note (book.model_admonition)", "attnlab info"),
       "attnlab/core/perplexity.py cached_perplexity", recompute="perplexity"),
    _c("pooled_ks", 1, ("windows", "lengths", "max_length", "model", "identity"),
       "attnlab.windows:pooled_critical_n", "minutes", ("03_six_percent",), "attnlab/windows.py pooled_result",
       recompute="pooled_ks"),
    _c("reading_windows", 1, ("reading", "windows", "lengths", "model", "identity"),
       "attnlab.windows:reading_critical_over_windows", "minutes", ("03_six_percent",),
       "attnlab/windows.py reading_result", recompute="reading_windows"),
    _c("fig4_without_repeats", 1, ("window", "max_length", "model", "identity"),
       "attnlab.windows:fig4_without_repeats", "seconds", ("05_gradients", "06_what_holds"),
       "attnlab/windows.py repeats_result", recompute="fig4_without_repeats"),
    _c("head_separability", 1, ("fig1_version", "fig3_version") + WINDOW_KEY,
       "attnlab.normalization.concentration:separability_by_concentration", "seconds",
       ("04_separability", "06_what_holds"), "attnlab/views/separability.py head_separability",
       recompute="head_separability"),
    _c("fig2c_ratio", 1, ("points", "fracs") + WINDOW_KEY, "attnlab.normalization.experiments:fig2c_ratio",
       "minutes", ("03_six_percent",), "attnlab/views/six_percent.py ratio_curve", recompute="fig2c_ratio"),
    _c("sink_shares", 1, ("window", "lengths", "normalizer", "device", "model", "identity", "text"),
       "attnlab.tools.sinks:sink_shares", "minutes", ("07_beyond_softmax",), "attnlab/views/sinks.py shares",
       recompute="sink_shares"),
    # v2: critical N of a subset of fewer heads than the KS test needs to reject (`critical_n.fewest_heads`) is NaN,
    # not 1 / L (Gemma 3's full layers without their sink heads: 2-4 heads)
    _c("sink_claims", 2, ("window", "lengths", "fig3_version", "device", "model", "identity", "text"),
       "attnlab.tools.sinks:sink_claims", "minutes", ("07_beyond_softmax",), "attnlab/views/sinks.py claims",
       recompute="sink_claims"),
    _c("layer_kinds", 1, ("window", "lengths", "device", "model", "identity", "text"),
       "attnlab.normalization.layer_kinds:layer_kind_rows", "minutes",
       ("01_vanishing", "06_what_holds", "07_beyond_softmax"), "attnlab/views/layer_kinds.py kinds",
       recompute="layer_kinds"),
    _c("critical_by_kind", 1, ("window", "lengths", "max_rows", "max_frac", "step_frac", "device", "model", "identity",
                               "text"),
       "attnlab.tools.critical_by_kind:critical_by_kind", "minutes", ("03_six_percent", "06_what_holds"),
       "attnlab/views/layer_kinds.py critical", recompute="critical_by_kind"),
    # chapter 7's (book.result through attnlab/views/normalizers.py)
    _c("compare_normalizers", 1, CHAPTER_KEY + ("lengths",), "attnlab.tools.compare:compare_normalizers", "minutes",
       ("07_beyond_softmax",), "attnlab/views/normalizers.py comparison, peers", ("crit50",), recompute="compare"),
    _c("compare_normalizers_each", 1, ("device", "L", "specs", "ssmax_ref_length", "model", "identity", "text"),
       "attnlab.tools.compare:compare_normalizers", "minutes", ("07_beyond_softmax",),
       "attnlab/views/normalizers.py each_layer", recompute="compare_each"),
    _c("bench_normalizers", 1, ("device", "lengths", "model", "identity", "text"),
       "attnlab.benchmarks:bench_normalizers", "minutes", ("07_beyond_softmax",),
       "attnlab/views/normalizers.py bench", recompute="bench"),
    # the chapters' own (book.result in a chapter's cells)
    _c("diagnose", 1, CHAPTER_KEY, "attnlab.tools.diagnose:diagnose", "minutes", ("08_diagnose",),
       "book/08_diagnose.ipynb cell 8b431e04", recompute="diagnose"),
)}


def version(name: str) -> int:
    """The declared version of computation `name`. KeyError (naming this module) when it is not declared."""
    if name not in COMPUTATIONS:
        raise KeyError(f"{name!r} is not a computation of attnlab/computations.py: declare it there")
    return COMPUTATIONS[name].version


def listing() -> list[dict]:
    """One plain dict per computation: name, version, inputs, compute, cost, probes, used_in, declared,
    recomputable."""
    return [{"name": c.name, "version": c.version, "inputs": list(c.inputs), "compute": c.compute, "cost": c.cost,
             "probes": [p or "tiny" for p in c.probes], "used_in": list(c.used_in), "declared": c.declared,
             "recomputable": bool(c.recompute)} for c in COMPUTATIONS.values()]
