r"""Sliders and figures for the book: kernel-free sliders (precomputed frames), live sliders (kernel),
static figures. Views only: no science here.

How to write a chapter
======================
A chapter is ``book/NN_name.ipynb``; it runs from ``book/`` (as jupyter-book and nbval run it). Its first
cell is the setup cell (``scripts/setup_cells.py`` writes and checks it); then it takes its model and
Results through `attnlab.book` and shows them with the helpers below; what would take more than a few
lines (a table builder, a frame renderer, prose from measured numbers) lives in ``attnlab/views/`` with
a test, so the visible cells show the calculation::

    from attnlab import book
    from attnlab.widgets import frame_slider, frames_from, static_figure
    inp = book.inputs()                     # ATTNLAB_MODEL / ATTNLAB_DEVICE (defaults auto, cpu)
    res = book.figure_results(["fig1"], inp)

Kernel-free slider: works on the static site, offline, no kernel. **Every chapter needs at least
one**; the browser test checks that moving each one changes the figure. Draw one Figure per value
(return it, do not ``plt.show()`` it); the helpers render it to PNG and close it::

    def draw(T):
        fig, ax = plt.subplots(figsize=(5, 3), layout="constrained")
        ...
        return fig
    Ts = [0.25, 0.5, 1, 2, 4]
    frame_slider(frames_from(draw, Ts), Ts, r"\(T\)", readout_format=".2f")   # last line of the cell

Two sliders (e.g. L and N): ``frames[i][j]`` is the frame for ``values1[i]``, ``values2[j]``::

    frame_slider_2d([[draw(L, N) for N in Ns] for L in Ls], Ls, Ns, "L", "N")

Keep pages light: a slider's frames are stored in the notebook (the site serves each as a file, fetched
when shown). At ``FRAME_DPI`` (100) a 5 x 3 inch frame is 15-60 KB: use few values, a small figsize or
``dpi=``; a warning says when a slider's frames pass ``FRAME_BUDGET``. Each frame's phone version is drawn
too (`render`): the build keeps it for the site, the committed chapter does not (below). Math in a
slider description needs ``\(..\)``, not ``$..$``.

Live slider: for readers running the notebook (Jupyter, Colab); on the static site it does not move,
and says so. ``update_fn`` returns a Figure and must be cheap (recompute from a cached Trace, never a
forward pass); ``time_updates`` measures it. Specs are ipywidgets ``interact`` abbreviations::

    live_slider(lambda L, T: draw_from_trace(trace, L, T), L=(64, 1024, 64), T=(0.1, 4.0, 0.1))

Static figure (print/PDF, readers without JavaScript): ``static_figure(fig)`` as the last line of a
cell or in ``display(...)``.

Checked numbers: tag a cell ``nbval-check-output`` (cell metadata; nbval's own tag) when its output is
small and deterministic (a verdict, a bound, a coarse rounding). ``make test`` compares those cells with
the outputs of its book build (scripts/check_outputs.py). Print model-specific numbers in unchecked cells.

Committing: notebooks are committed WITH outputs (the checks compare against them) and must stay small
(< 1 MB each: scripts/check_outputs.py MAX_BYTES, tests/test_committed_notebooks.py). They hold each figure
once, its desktop PNG in the output's HTML: the phone versions and the image/png copy stay in the build
(its execution cache, from which the site is made), and both ways of refreshing leave them out
(scripts/check_outputs.py `stored`). Refresh them with ``make notebooks`` (scripts/execute_notebooks.py, in place from
``book/``); one chapter: ``python scripts/execute_notebooks.py book/NN_name.ipynb``. Then list the
chapter in ``_toc.yml`` (``- file: book/NN_name``) or it is not built (the browser test fails).
"""
from __future__ import annotations

import base64
import io
import statistics
import sys
import time
import warnings
from typing import Any, Callable, Sequence, Union

import ipywidgets as widgets

Frame = Union[bytes, "matplotlib.figure.Figure"]  # noqa: F821

#: dpi used to render frames and figures: at 100 dpi a figure is shown at its own size on the page
#: (1 inch = 100 px), so its text is as large as it was drawn (never scaled down by the browser).
FRAME_DPI = 100
#: warn when one slider's frames (at FRAME_DPI: what a committed chapter stores) weigh more than this (bytes,
#: before base64).
FRAME_BUDGET = 600_000
#: CSS classes of the boxes on the page; the browser test finds kernel-free sliders by the first.
KERNEL_FREE_CLASS = "attnlab-frames"
LIVE_CLASS = "attnlab-live"

__all__ = [
    "fig_to_png", "frames_from", "frame_slider", "frame_slider_2d", "live_slider", "static_figure",
    "model_note", "FRAME_DPI", "FRAME_BUDGET",
]


def fig_to_png(fig: Any, dpi: int = FRAME_DPI, *, close: bool = True) -> bytes:
    """PNG bytes of a matplotlib Figure (fixed size, no tight bbox, so frames line up); closes it
    unless ``close=False``. Bytes pass through unchanged."""
    if isinstance(fig, (bytes, bytearray)):
        return bytes(fig)
    buf = io.BytesIO()
    # No "Software" tag: stored notebooks do not change with the matplotlib version.
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    if close:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return buf.getvalue()


def frames_from(draw: Callable[..., Any], values: Sequence[Any], dpi: int = FRAME_DPI) -> list[bytes]:
    """``[render(draw(v)) for v in values]``: one PNG frame per value (with its phone version), figures
    closed."""
    return [render(draw(v), dpi) for v in values]


# ------------------------------------------------------------------------------------ phone versions

#: The phone version of a figure is drawn for a 390 px screen's text column (about 336-358 CSS px):
#: PHONE_WIDTH_IN inches at PHONE_DPI, shown at PHONE_WIDTH_IN * FRAME_DPI CSS px (1.5 device pixels per
#: CSS px: sharp on phones, light on the page), its panels stacked, no text under PHONE_MIN_PT points,
#: which is PHONE_MIN_PT * FRAME_DPI / 72 = 11.1 CSS px there.
PHONE_WIDTH_IN = 3.3
PHONE_DPI = 150
PHONE_MIN_PT = 8.0
#: the screens that get the phone version (the theme's own narrow breakpoint is 576 px)
PHONE_MEDIA = "(max-width: 600px)"


class Rendered(bytes):
    """PNG bytes of a figure at FRAME_DPI (what Jupyter, GitHub and print show), carrying the phone
    version (``phone``: PNG bytes or None, drawn at PHONE_DPI) and the smallest text of each version in
    points (``text_pt``, ``phone_text_pt``; None when unknown), which the browser test turns into CSS px."""

    phone: bytes | None = None
    text_pt: float | None = None
    phone_text_pt: float | None = None
    fig_title: str | None = None          # (not `title`: bytes has a method of that name)


def figure_title(fig: Any) -> str:
    """The figure's suptitle, else its panels' titles joined by '; ' (one line; '' when it has none)."""
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else ""
    title = title or "; ".join(a.get_title() for a in fig.axes if a.get_title())
    return " ".join(title.split())


def _texts(fig: Any) -> list:
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def smallest_text_pt(fig: Any) -> float | None:
    """The smallest font size (points) of the figure's visible, non-empty texts (ticks, labels, legend)."""
    sizes = [float(t.get_fontsize()) for t in _texts(fig)]
    return min(sizes) if sizes else None


def _grid_cells(fig: Any):
    """([(axes, row, col)], grid) when every axes of `fig` is one cell of one top-level grid (colorbars of a
    constrained layout aside); None for anything else (spanning axes, nested grids, colorbars placed by
    hand): those figures get no phone version."""
    cells, grid = [], None
    constrained = type(fig.get_layout_engine()).__name__ == "ConstrainedLayoutEngine"
    for ax in fig.axes:
        if constrained and getattr(ax, "_colorbar", None) is not None:
            continue                           # the layout engine places a colorbar beside its panel again
        ss = ax.get_subplotspec()
        if ss is None or ss.num1 != ss.num2 or (grid is not None and ss.get_gridspec() is not grid):
            return None
        grid = ss.get_gridspec()
        if ax.get_visible():
            cells.append((ax, ss.rowspan.start, ss.colspan.start))
    return (cells, grid) if cells else None


#: the share of a phone figure's width an x label may take: right of the y axis's ticks and label (about a quarter)
XLABEL_ROOM = 0.7


def phone_layout(fig: Any) -> bool:
    """Re-lay `fig` out for a phone's text column, in place: one panel per row (reading order), each
    PHONE_WIDTH_IN wide and about as tall as its aspect asks (1.9 to 2.8 in), its legend below it, no text
    under PHONE_MIN_PT. False (figure untouched) for layouts it cannot stack (see `_grid_cells`)."""
    found = _grid_cells(fig)
    if found is None:
        return False
    cells, grid = found
    nrows, ncols = grid.get_geometry()
    w, h = fig.get_size_inches()
    # as tall as the panel's aspect asks, within 1.9 in and 2.8 in (or the panel's own height, if taller:
    # a heat map of 30 layers keeps room for its 30 tick labels)
    panel_h = min(max(2.8, h / nrows), max(1.9, PHONE_WIDTH_IN * (h / nrows) / (w / ncols) * 1.1))
    axes = [ax for ax, _, _ in sorted(cells, key=lambda c: (c[1], c[2]))]
    title = 0.45 if getattr(fig, "_suptitle", None) is not None else 0.0
    heights = [panel_h] * len(axes)
    _stack(fig, axes, heights, title)
    for t in _texts(fig):
        if t.get_fontsize() < PHONE_MIN_PT:
            t.set_fontsize(PHONE_MIN_PT)
    _wrap_x_labels(fig, axes)
    for leg in list(fig.legends):              # a legend of the whole figure: below the panels, one entry per row
        handles, labels = leg.legend_handles, [t.get_text() for t in leg.texts]
        size, frame = max([PHONE_MIN_PT] + [t.get_fontsize() for t in leg.texts]), leg.get_frame_on()
        leg.remove()
        fig.legend(handles, labels, loc="outside lower center", ncols=1, fontsize=size, frameon=frame)
    try:
        fig.set_layout_engine("constrained")
    except RuntimeError:                       # a colorbar made under another engine: keep it
        fig.tight_layout()
    extra = _legends_below(fig, axes)
    if any(extra):
        _stack(fig, axes, [hh + e for hh, e in zip(heights, extra)], title)
    return True


def _wrap_x_labels(fig: Any, axes: list) -> None:
    """Each x label wider than its room broken into lines that fit it (a label runs off the image otherwise: the
    layout engine sees no automatic wrapping). A label is centred under its panel, which starts right of the y
    axis's ticks and label, so its room is what lies right of them (XLABEL_ROOM of the figure's width); a break
    never falls inside `$...$` (mathtext), which would break the label."""
    import re
    import textwrap

    room = XLABEL_ROOM * fig.bbox.width
    for ax in axes:
        label = ax.xaxis.label
        text, width = label.get_text(), label.get_window_extent().width
        if text and width > room:
            glued = re.sub(r"\$[^$]*\$", lambda m: m.group(0).replace(" ", "\x00"), text)
            lines = textwrap.wrap(glued, max(12, int(len(text) * room / width)), break_long_words=False)
            label.set_text("\n".join(lines).replace("\x00", " "))


def _stack(fig: Any, axes: list, heights: list[float], title: float) -> None:
    """`axes` one per row of a new grid, rows `heights` inches tall, the figure PHONE_WIDTH_IN wide."""
    grid = fig.add_gridspec(len(axes), 1, height_ratios=heights)
    fig.set_size_inches(PHONE_WIDTH_IN, sum(heights) + title)
    for i, ax in enumerate(axes):
        ax.set_subplotspec(grid[i, 0])


def _legends_below(fig: Any, axes: list) -> list[float]:
    """Each panel's legend moved below its x label (a phone-wide panel has no room to share with one);
    the inches each panel needs for it."""
    from matplotlib.transforms import ScaledTranslation

    if not any(ax.get_legend() for ax in axes):
        return [0.0] * len(axes)
    fig.draw_without_rendering()
    extra = []
    for ax in axes:
        leg = ax.get_legend()
        if leg is None or not leg.get_visible():
            extra.append(0.0)
            continue
        below = ax.get_tightbbox(bbox_extra_artists=[]).y0         # the lowest tick label or x label, px
        drop = (ax.bbox.y0 - below) / fig.dpi + 0.05                # inches
        leg.set_loc("upper center")
        leg.set_bbox_to_anchor((0.5, 0.0), transform=ax.transAxes + ScaledTranslation(0, -drop, fig.dpi_scale_trans))
        extra.append(leg.get_window_extent().height / fig.dpi + 0.05)
    return extra


def render(fig: Any, dpi: int = FRAME_DPI, colors: int | None = None) -> Rendered:
    """The figure as `Rendered` PNG bytes with its phone version (see `phone_layout`), figure closed.
    `colors`: a palette of that many colours (pages about four times lighter). Bytes pass through (a
    `Rendered` unchanged, plain bytes with no phone version)."""
    if isinstance(fig, Rendered):
        return fig
    if isinstance(fig, (bytes, bytearray)):
        return Rendered(bytes(fig))
    import matplotlib.pyplot as plt

    for t in [getattr(fig, "_suptitle", None)] + [ax.title for ax in fig.axes]:
        if t is not None:
            t.set_wrap(True)                   # a long title wraps instead of running off the figure
    try:
        out = Rendered(_light(fig_to_png(fig, dpi, close=False), colors))
        out.text_pt, out.fig_title = smallest_text_pt(fig), figure_title(fig)
        if phone_layout(fig):
            out.phone = _light(fig_to_png(fig, PHONE_DPI, close=False), colors)
            out.phone_text_pt = smallest_text_pt(fig)
    finally:
        plt.close(fig)
    return out


def _light(png: bytes, colors: int | None) -> bytes:
    if not colors:
        return png
    from PIL import Image

    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(
        out, "PNG", optimize=True)
    return out.getvalue()


def _labels(values: Sequence[Any], fmt: str | None, what: str) -> list[str]:
    labels = [format(v, fmt) if fmt else str(v) for v in values]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{what}: slider labels {labels} are not unique; pass a finer readout_format")
    return labels


def _slider(values: Sequence[Any], description: str, fmt: str | None) -> widgets.SelectionSlider:
    if len(values) == 0:
        raise ValueError(f"{description}: no slider values")
    labels = _labels(values, fmt, description)
    return widgets.SelectionSlider(
        options=list(zip(labels, range(len(values)))), description=description,
        continuous_update=True, readout=True, layout=widgets.Layout(width="min(100%, 480px)"),
        style={"description_width": "initial"},
    )


def _image(png: bytes) -> widgets.Image:
    # flex-start: inside a VBox the image keeps its own size instead of stretching to the width.
    return widgets.Image(value=png, format="png",
                         layout=widgets.Layout(max_width="100%", align_self="flex-start"))


def _check_budget(pngs: Sequence[bytes], description: str) -> None:
    total = sum(len(p) for p in pngs)        # not the phone versions: the committed chapter leaves them out
    if total > FRAME_BUDGET:
        warnings.warn(
            f"slider {description!r}: {len(pngs)} frames weigh {total / 1e3:.0f} KB "
            f"(budget {FRAME_BUDGET / 1e3:.0f} KB): use fewer values, a smaller figsize or dpi",
            stacklevel=3,
        )


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _png_size(png: bytes) -> tuple[int, int]:
    import struct

    return struct.unpack(">II", png[16:24]) if png[:8] == b"\x89PNG\r\n\x1a\n" else (0, 0)


def _phone_srcset(png: bytes | None) -> str | None:
    return None if not png else f"{_data_uri(png)} {PHONE_DPI / FRAME_DPI:g}x"


def _img_tag(png: bytes, alt: str, cls: str = "attnlab-figure") -> str:
    """<img> at the PNG's own pixel size (width/height attributes: no layout shift, no upscaling); for a
    `Rendered` PNG with a phone version, a <picture> whose <source> phones take (drawn for their
    column: stacked panels, text at least 11 CSS px). ``data-text-pt`` / ``data-phone-text-pt``: each
    version's smallest text in points, which the browser test turns into rendered CSS px."""
    from html import escape

    w, h = _png_size(png)
    size = f' width="{w}" height="{h}"' if w else ""
    pt = getattr(png, "text_pt", None)
    data = f' data-text-pt="{pt:g}"' if pt else ""
    img = f'<img class="{cls}" src="{_data_uri(png)}" alt="{escape(alt, quote=True)}"{size}{data}'
    phone = getattr(png, "phone", None)
    if not phone:
        return img + ">"
    pw, ph = (round(v * FRAME_DPI / PHONE_DPI) for v in _png_size(phone))
    ppt = getattr(png, "phone_text_pt", None)
    img += f' data-phone-text-pt="{ppt:g}">' if ppt else ">"
    return (f'<picture><source media="{PHONE_MEDIA}" srcset="{_phone_srcset(phone)}" width="{pw}" '
            f'height="{ph}">{img}</picture>')


#: class of a numbered figure on the site: the build numbers its caption per chapter ("Figure 4.2.",
#: scripts/attnlab_book.py)
FIGURE_CLASS = "attnlab-fig"


def _figure_html(inner: str, caption: str) -> str:
    """`inner` (an image or a slider) as a numbered figure with its caption (the build adds the number)."""
    from html import escape

    cap = " ".join(caption.split())
    return (f'<figure class="{FIGURE_CLASS}" style="margin:0">{inner}'
            f'<figcaption class="attnlab-caption">{escape(cap)}</figcaption></figure>')


# The kernel-free slider of the static site: plain HTML range inputs and a few lines of JavaScript,
# no widget library (the page loads no ipywidgets bundle). Frames are data URIs in a JSON block.
_SLIDER_JS = """<script>(function () {
  var box = document.currentScript.parentElement;
  var data = JSON.parse(box.querySelector('script[type="application/json"]').textContent);
  var img = box.querySelector("img"), source = box.querySelector("source");
  var inputs = box.querySelectorAll("input"), outs = box.querySelectorAll("output");
  data.frames[0] = img.src;
  if (source) data.phone[0] = source.srcset;
  function show() {
    var at = 0;
    inputs.forEach(function (input, k) {
      var v = +input.value, label = data.labels[k][v];
      outs[k].textContent = label;
      input.setAttribute("aria-valuetext", data.names[k] + " = " + label);
      at = at * data.labels[k].length + v;
    });
    img.src = data.frames[at]; img.alt = data.alts[at];
    if (source) source.srcset = data.phone[at] || data.frames[at];
  }
  inputs.forEach(function (input) { input.addEventListener("input", show); });
})();</script>"""


def slider_html(pngs: Sequence[bytes], labels: Sequence[Sequence[str]], descriptions: Sequence[str],
                alt: str) -> str:
    """Self-contained HTML of a kernel-free slider: one range input per axis, frames in row-major
    order (``pngs[i * len(labels[1]) + j]`` for two axes), readouts, alt text per frame."""
    import itertools
    import json
    from html import escape

    # each frame's alt: the slider's description and the values, then what the frame's own titles say
    alts = [alt + " (" + ", ".join(f"{d} = {v}" for d, v in zip(descriptions, combo)) + ")"
            + (f": {p.fig_title}" if getattr(p, "fig_title", None) else "")
            for combo, p in zip(itertools.product(*labels), pngs)]
    rows = "".join(
        f'<label class="attnlab-control" style="display:flex;align-items:center;gap:0.6em;margin:0.2em 0">'
        f'<span style="min-width:4em">{escape(d)}</span><input type="range" min="0" max="{len(ls) - 1}" step="1" '
        f'value="0" aria-label="{escape(d, quote=True)}" aria-valuetext="{escape(f"{d} = {ls[0]}", quote=True)}" '
        f'style="flex:0 1 18em;min-width:6em"><output style="min-width:3em">{escape(ls[0])}</output></label>'
        for d, ls in zip(descriptions, labels))
    payload = json.dumps({"labels": [list(ls) for ls in labels], "names": list(descriptions), "alts": alts,
                          "frames": [None] + [_data_uri(p) for p in pngs[1:]],
                          "phone": [None] + [_phone_srcset(getattr(p, "phone", None)) for p in pngs[1:]]}
                         ).replace("</", "<\\/")
    return (f'<div class="{KERNEL_FREE_CLASS}">{rows}{_figure_html(_img_tag(pngs[0], alts[0]), alt)}'
            f'<script type="application/json">{payload}</script>{_SLIDER_JS}</div>')


class SliderBox(widgets.VBox):
    """A VBox (the slider in Jupyter and Colab) that also offers ``text/html``, what the static site
    shows with no widget library: for kernel-free sliders the same slider in plain HTML, for live
    sliders the first figure and a note that it moves only with a running kernel; and ``image/png``
    for the book's PDF build (the committed chapter keeps the HTML only: scripts/check_outputs.py `stored`)."""

    def __init__(self, children, fallback_png: bytes | None = None, html: str | None = None, **kwargs):
        super().__init__(children, **kwargs)
        self._fallback_png = fallback_png
        self._html = html

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None and self._fallback_png:
            data["image/png"] = base64.b64encode(self._fallback_png).decode("ascii")
        if data is not None and self._html:
            data["text/html"] = self._html
        return data


def frame_slider(frames: Sequence[Frame], values: Sequence[Any], description: str, *,
                 readout_format: str | None = None, dpi: int = FRAME_DPI, alt: str = "") -> SliderBox:
    """Kernel-free slider over precomputed frames: ``frames[i]`` is shown at ``values[i]``.

    The slider and an ``ipywidgets.Stack`` of ``Image`` frames are joined by a ``jslink`` in the
    browser, so the static site needs no kernel. ``readout_format`` formats the values for the
    readout (``".2f"``, ``"d"``, ...); ``alt`` describes the figure (the value is appended)."""
    if len(frames) != len(values):
        raise ValueError(f"{description}: {len(frames)} frames for {len(values)} values")
    pngs = [render(f, dpi) for f in frames]
    _check_budget(pngs, description)
    slider = _slider(values, description, readout_format)
    stack = widgets.Stack([_image(p) for p in pngs], selected_index=0)
    widgets.jslink((slider, "index"), (stack, "selected_index"))
    labels = [_labels(values, readout_format, description)]
    html = slider_html(pngs, labels, [_plain(description)],
                       alt or f"One precomputed figure per value of {_plain(description)}: move the slider")
    return SliderBox([slider, stack], fallback_png=pngs[0], html=html).add_class(KERNEL_FREE_CLASS)


def frame_slider_2d(frames: Sequence[Sequence[Frame]], values1: Sequence[Any], values2: Sequence[Any],
                    description1: str, description2: str, *, readout_format1: str | None = None,
                    readout_format2: str | None = None, dpi: int = FRAME_DPI, alt: str = "") -> SliderBox:
    """Two kernel-free sliders over a grid of frames: ``frames[i][j]`` is shown at
    (``values1[i]``, ``values2[j]``). One inner Stack per ``values1[i]`` inside an outer Stack; the
    first slider picks the inner Stack, the second is jslinked to every inner Stack."""
    if len(frames) != len(values1) or any(len(row) != len(values2) for row in frames):
        raise ValueError(
            f"{description1}/{description2}: frames must be a {len(values1)} x {len(values2)} grid")
    pngs = [[render(f, dpi) for f in row] for row in frames]
    _check_budget([p for row in pngs for p in row], f"{description1}/{description2}")
    slider1 = _slider(values1, description1, readout_format1)
    slider2 = _slider(values2, description2, readout_format2)
    inner = [widgets.Stack([_image(p) for p in row], selected_index=0) for row in pngs]
    outer = widgets.Stack(inner, selected_index=0)
    widgets.jslink((slider1, "index"), (outer, "selected_index"))
    for stack in inner:
        widgets.jslink((slider2, "index"), (stack, "selected_index"))
    labels = [_labels(values1, readout_format1, description1), _labels(values2, readout_format2, description2)]
    names = [_plain(description1), _plain(description2)]
    html = slider_html([p for row in pngs for p in row], labels, names,
                       alt or f"One precomputed figure per value of {names[0]} and {names[1]}: move the sliders")
    return SliderBox([slider1, slider2, outer], fallback_png=pngs[0][0], html=html).add_class(KERNEL_FREE_CLASS)


def live_slider(update_fn: Callable[..., Any], *, dpi: int = FRAME_DPI, alt: str = "", caption: str = "",
                **slider_specs: Any) -> SliderBox:
    """Kernel sliders: ``update_fn(**values)`` returns a matplotlib Figure (or PNG bytes), redrawn
    into an Image whenever a slider is released. Specs are ``interact`` abbreviations
    (``L=(64, 1024, 64)``, ``T=[0.5, 1, 2]``) or widgets. ``update_fn`` must be cheap.

    On the site: the first figure as a numbered figure with ``caption`` (what it shows; default: ``alt``, else
    the figure's titles), drawn for phones too (`_first_frame`), and a note on how to move it."""
    if not slider_specs:
        raise ValueError("live_slider needs at least one slider spec, e.g. T=(0.1, 4.0, 0.1)")
    controls = {}
    for name, spec in slider_specs.items():
        w = spec if isinstance(spec, widgets.ValueWidget) else widgets.interactive.widget_from_abbrev(spec)
        if w is None:
            raise ValueError(f"live_slider: cannot make a slider from {name}={spec!r}")
        if not w.description:
            w.description = name
        if hasattr(w, "continuous_update"):
            w.continuous_update = False
        controls[name] = w
    image = _image(b"")
    note = widgets.HTML("<small>Live slider: it redraws only with a running Python kernel.</small>")

    def redraw(*_):
        image.value = fig_to_png(update_fn(**{k: w.value for k, w in controls.items()}), dpi)

    for w in controls.values():
        w.observe(redraw, names="value")
    redraw()
    names = [_plain(w.description) for w in controls.values()]      # as the sliders show them: "log10 α"
    first = ", ".join(f"{n} = {w.value}" for n, w in zip(names, controls.values()))
    png = _first_frame(update_fn, controls, image, dpi)
    shown = _img_tag(png, (alt or caption or "Live figure") + f" ({first})")
    what = caption or alt or getattr(png, "fig_title", None) or "Live figure"
    html = (f'<div class="{LIVE_CLASS}">{_figure_html(shown, what)}'
            f"<p><small>A live slider ({', '.join(names)}) drives this figure when you run this chapter "
            f"(Colab, Binder or Jupyter: the buttons at the top); here it shows {first}.</small></p></div>")
    box = SliderBox([widgets.HBox(list(controls.values())), image, note], fallback_png=bytes(image.value),
                    html=html)
    return box.add_class(LIVE_CLASS)


def _first_frame(update_fn: Callable[..., Any], controls: dict, image: Any, dpi: int) -> bytes:
    """What the site shows of a live slider: its first figure with its phone version: drawn once more when
    `update_fn` draws a new Figure per call; from ``update_fn.new_figure(**values)`` (a new Figure of the same
    frame) when `update_fn` keeps one Figure and redraws it (that one must not be re-laid out); as returned
    when it returns `Rendered` PNG bytes (`attnlab.book.png`); else the widget's own PNG."""
    values = {k: w.value for k, w in controls.items()}
    new_figure = getattr(update_fn, "new_figure", None)
    if new_figure is not None:
        return render(new_figure(**values), dpi)
    kept = update_fn(**values)
    if isinstance(kept, Rendered):
        return kept
    if isinstance(kept, (bytes, bytearray)):
        return bytes(image.value)
    again = update_fn(**values)
    if again is kept:
        return bytes(image.value)
    import matplotlib.pyplot as plt

    plt.close(kept)
    return render(again, dpi)


def time_updates(update_fn: Callable[..., Any], *args: Any, n: int = 5, what: str = "read + draw") -> float:
    """Median milliseconds of `n` calls of ``update_fn(*args)`` drawn to PNG (one live-slider update each), also
    printed to stderr: Jupyter shows it, the site does not."""
    ms = []
    for _ in range(n):
        t0 = time.perf_counter()
        fig_to_png(update_fn(*args))
        ms.append(1e3 * (time.perf_counter() - t0))
    median = statistics.median(ms)
    print(f"one update of the live slider ({what}): median {median:.0f} ms of {n}", file=sys.stderr)
    return median


class StaticFigure:
    """A PNG with alt text and a caption: ``text/html`` (a numbered figure: the <img> at its own size, or its
    phone version, and the caption) for the site, and for Jupyter, Colab and GitHub (the committed chapter keeps
    it without the phone version and without the ``image/png``: scripts/check_outputs.py `stored`); ``image/png``
    for print (the book's PDF build)."""

    def __init__(self, png: bytes, alt: str, caption: str = ""):
        self.data, self.alt, self.caption = png, alt, caption or alt

    def _repr_mimebundle_(self, **kwargs):
        return {"image/png": base64.b64encode(self.data).decode("ascii"),
                "text/html": _figure_html(_img_tag(self.data, self.alt), self.caption),
                "text/plain": f"[figure: {self.alt}]"}      # not the default repr: no memory address


def static_figure(fig: Any, dpi: int = FRAME_DPI, alt: str = "", caption: str = "") -> StaticFigure:
    """A PNG of ``fig`` (closed; with its phone version, see `render`) with alt text (default: the
    figure's titles) and a caption (default: the alt text), for the site, print and readers without
    JavaScript. Use it as the last line of a cell or inside ``display(...)``."""
    png = render(fig, dpi)
    return StaticFigure(png, " ".join((alt or png.fig_title or "Figure").split()), caption)


def _plain(description: str) -> str:
    """A slider description without its LaTeX delimiters: "\\(L\\)" -> "L"."""
    return description.replace("\\(", "").replace("\\)", "").replace("\\", "")


def model_note(model: Any, device: str | None = None):
    """'Computed with model X on device Y' as a cell output; tags the page with the model so that
    ``make book`` can report which model produced the site. ``model``: a name, or an object with
    ``.name`` (and ``.device``), e.g. an ``AttnModel``."""
    from html import escape

    from IPython.display import HTML

    if not isinstance(model, str):
        device = device or (str(model.device) if getattr(model, "device", None) is not None else None)
        model = model.name

    where = f" on <code>{escape(device)}</code>" if device else ""
    return HTML(f'<p class="attnlab-model" data-attnlab-model="{escape(model, quote=True)}">'
                f"Computed with model <code>{escape(model)}</code>{where}.</p>")
