"""The one figure style: every text of a figure at least 9 pt, so that at 100 dpi (the book shows
figures at their own size) no label is smaller than 9 pt on the page, on a phone included. And the one mark of
a value that differs from run to run (`volatile`)."""
from __future__ import annotations

from html import escape

#: font sizes (pt) of every figure attnlab draws; nothing smaller than MIN_FONT_PT
MIN_FONT_PT = 9
FIGURE_STYLE = {
    "font.size": MIN_FONT_PT,
    "axes.titlesize": MIN_FONT_PT,
    "axes.labelsize": MIN_FONT_PT,
    "xtick.labelsize": MIN_FONT_PT,
    "ytick.labelsize": MIN_FONT_PT,
    "legend.fontsize": MIN_FONT_PT,
    "legend.title_fontsize": MIN_FONT_PT,
    "figure.titlesize": MIN_FONT_PT + 1,
    "legend.handlelength": 1.5,
    "legend.borderaxespad": 0.3,
}


def literal(text) -> str:
    """`text` shown as typed in a figure: a model path or file name with `$...$` is not mathtext (it broke
    the title, and the figure with it)."""
    return str(text).replace("$", r"\$")


def use_figure_style() -> None:
    """Set FIGURE_STYLE in matplotlib's rcParams (the book and the CLI call it once)."""
    import matplotlib

    matplotlib.rcParams.update(FIGURE_STYLE)


#: the attribute that marks a value differing from run to run; scripts/check_outputs.py masks what it marks
VOLATILE_ATTR = "data-attnlab-volatile"


def volatile(value) -> str:
    """HTML of a value that differs from run to run on the same code, model and text: a duration, a throughput,
    a "fastest method" pick. Everything a chapter prints of that kind goes through here, so that the output check
    (scripts/check_outputs.py) masks exactly these marks and compares everything else. `value` is shown as text."""
    return f'<span class="attnlab-volatile" {VOLATILE_ATTR}="">{escape(str(value))}</span>'


def seconds(s: float) -> str:
    """A duration in whole seconds, marked `volatile`: "40 s"."""
    return volatile(f"{s:.0f} s")
