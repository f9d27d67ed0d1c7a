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


#: a colour-blind-safe palette (Okabe & Ito 2008, without its yellow, too pale on a white figure): the colours of
#: figures whose lines or bars are told apart by colour (chapter 7's normalizers)
OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7")
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def series_style(i: int) -> dict:
    """Colour, line style and marker of the i-th series: colour, dash and marker change together, so lines stay
    apart without colour (print, colour vision deficiency) and adjacent series differ in all three."""
    return {"color": OKABE_ITO[i % len(OKABE_ITO)], "ls": LINE_STYLES[i % len(LINE_STYLES)],
            "marker": MARKERS[i % len(MARKERS)]}


def srgb_to_linear(rgb):
    """sRGB in [0, 1] (array [..., 3]) -> linear RGB."""
    import numpy as np

    rgb = np.asarray(rgb, dtype=float)
    return np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)


#: deuteranopia (severity 1) on linear RGB: Machado, Oliveira & Fernandes (2009), Table 1
DEUTERANOPIA = ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.011820, 0.042940, 0.968881))


def simulate_deuteranopia(rgb):
    """sRGB [..., 3] in [0, 1] -> the linear RGB a deuteranope sees (clipped to [0, 1])."""
    import numpy as np

    return np.clip(srgb_to_linear(rgb) @ np.asarray(DEUTERANOPIA).T, 0.0, 1.0)


def linear_to_lab(lin):
    """Linear RGB [..., 3] (D65) -> CIELAB [..., 3]."""
    import numpy as np

    xyz = np.asarray(lin, dtype=float) @ np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                                                   [0.0193, 0.1192, 0.9505]]).T
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1)


def min_color_distance(colors, deuteranopia: bool = True) -> float:
    """Smallest CIELAB distance (Delta E 1976) between two of `colors` (matplotlib colour specs), as a
    deuteranope sees them (or as drawn). About 10 and more: told apart at a glance; under 5: hard."""
    import itertools

    import numpy as np
    from matplotlib.colors import to_rgb

    rgb = np.array([to_rgb(c) for c in colors])
    lab = linear_to_lab(simulate_deuteranopia(rgb) if deuteranopia else srgb_to_linear(rgb))
    return min(float(np.linalg.norm(a - b)) for a, b in itertools.combinations(lab, 2))
