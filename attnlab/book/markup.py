"""The page's markup: HTML tables and prose with the checker's plain notation typeset (`rendered`), an exercise's
answer and its numbers as LaTeX (`tex`), light PNG frames, plain log axes, and a mean over heads for the prose."""
from __future__ import annotations

from typing import Sequence

from attnlab.core.result import Result
from attnlab.core.style import seconds, volatile  # noqa: F401 (chapters: book.seconds, book.volatile)


#: plain-text notation of the claim checker and the Results (terminal-friendly) -> rendered math on the page
NOTATION = (
    (r"\bd~", r"\(\tilde d\)"), (r"\bd_max_([A-Za-z])\b", r"\(d_{\max}^{\1}\)"), (r"\bd_max\b", r"\(d_{\max}\)"),
    (r"\bR\^2", r"\(R^2\)"), (r"\bN_s/N\b", r"\(N_s/N\)"), (r"\babar\b", r"\(\bar a\)"),
    (r"\bsqrt\(2\)", "√2"), (r"\beps\b", "ε"), (r"\bDelta\b", "Δ"), (r"\balpha\b", "α"),
    (r"\bbeta\b", "β"), (r"->", "→"), (r"\+-", "±"), (r"!=", "≠"),
)


#: the HTML tags a table cell may carry; any other "<" is text
TABLE_TAGS = ("a", "b", "i", "em", "strong", "code", "sup", "sub", "span", "br", "small", "p", "ul", "li")


def rendered(text) -> str:
    """Plain notation (`d~`, `R^2`, `<=`, `eps`, ...) as rendered math, outside HTML tags, <code> spans and LaTeX
    spans `\\( .. \\)` (left to MathJax) only; other values unchanged (as str)."""
    import re

    text = str(text).replace("<=", "≤").replace(">=", "≥")
    tag = r"</?(?:%s)\b[^>]*>" % "|".join(TABLE_TAGS)
    text = re.sub(r"<(?!/?(?:%s)\b)" % "|".join(TABLE_TAGS), "&lt;", text)   # "T < 0.1", "x<y": text
    parts = re.split(f"(<code>.*?</code>|{tag}|\\\\\\(.*?\\\\\\))", text)     # code (claim ids) stays as written
    for i in range(0, len(parts), 2):                # even parts are text, odd parts are tags
        for pattern, repl in NOTATION:
            parts[i] = re.sub(pattern, lambda m, r=repl: r.replace("\\1", m.group(1) if m.groups() else ""), parts[i])
    return "".join(parts)


def table(header: Sequence[str], rows: Sequence[Sequence], caption: str = ""):
    """A small HTML table (a view: the numbers come from Results and attnlab functions); plain notation
    in the cells is rendered as math (`rendered`; MathJax typesets the `mathjax_process` box). Each cell
    carries its column's name (`data-label`): on a phone the site's stylesheet shows each row as a card."""
    import re
    from html import escape

    from IPython.display import HTML

    cell = 'style="padding:3px 10px; vertical-align:top; text-align:left; border-bottom:1px solid #ddd"'
    head = "".join(f"<th {cell}>{rendered(h)}</th>" for h in header)
    labels = [escape(re.sub(r"<[^>]+>", "", str(h)), quote=True) for h in header]   # a phone shows rows as cards
    body = "".join("<tr>" + "".join(f'<td data-label="{lab}" {cell}>{rendered(c)}</td>' for lab, c in zip(labels, r))
                   + "</tr>" for r in rows)
    cap = f"<caption>{rendered(caption)}</caption>" if caption else ""
    return HTML(f'<div class="mathjax_process attnlab-table"><table style="border-collapse:collapse">{cap}'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


def registry_table(groups: Sequence[tuple[str, dict]], first: str = "choice"):
    """HTML table of reading registries: for each (what, {name: Reading}) group, one row per reading (name,
    label, source, formula), `what` on the group's first row, under the column `first`."""
    return table([first, "reading", "label", "source", "formula"],
                 [[what if i == 0 else "", f"<code>{name}</code>", r.label, r.source, r.formula]
                  for what, reg in groups for i, (name, r) in enumerate(reg.items())])


def prose(html: str):
    """A paragraph (or list) of HTML computed on the page, with the checker's plain notation typeset
    (`rendered`): what chapters display after their tables."""
    from IPython.display import HTML

    return HTML(f'<div class="mathjax_process">{rendered(html)}</div>')


def answer(markdown: str):
    """An exercise's answer: Markdown prose with `$..$` maths, built from computed numbers (`tex`). The page shows
    it above the solution's code (book/_assets/site/attnlab-site.css); Jupyter renders it too."""
    from IPython.display import Markdown

    return Markdown(markdown)


def tex(x, fmt: str = ".3g") -> str:
    """A number as LaTeX for `$..$`: 1.23e+04 -> `1.23 \\times 10^{4}`, inf -> `\\infty`, nan -> `\\text{n/a}`."""
    import math
    import re

    x = float(x)
    if math.isnan(x):
        return r"\text{n/a}"
    if math.isinf(x):
        return r"\infty" if x > 0 else r"-\infty"
    m = re.fullmatch(r"(-?[0-9.]+)e([+-])0*([0-9]+)", format(x, fmt))
    if not m:
        return format(x, fmt)
    mant, sign, exp = m.groups()
    power = f"10^{{{'-' if sign == '-' else ''}{exp}}}"
    return power if mant in ("1", "1.0", "1.00") else f"{mant} \\times {power}"


def png(fig, dpi: int = 100, colors: int = 64) -> bytes:
    """The figure as a light PNG (a `colors`-colour palette; with its phone version, `widgets.render`):
    frames are embedded in the page and the notebook, and this makes them about four times lighter with
    no visible change."""
    from attnlab.widgets import render

    return render(fig, dpi, colors=colors)


def plain_log(*axes, nice: bool | str = False) -> None:
    """Log axes with plain tick labels and no minor-tick labels (mathtext labels make every redraw
    slow); `nice`: 1-2-5 major ticks, for short ranges (True: both axes, "x" or "y": one)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for ax in axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if axis.get_scale() == "log":
                if nice is True or nice == name:
                    axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                axis.set_minor_formatter(NullFormatter())


def head_mean(result: Result, key: str, **where) -> float:
    """Mean over heads (rows matching `where`) of the per-head value `key`, NaN rows ignored."""
    import warnings

    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # no finite value: NaN, said by the NaN itself
        return float(np.nanmean(result.column(key, **where)))
