"""Sliders and figures for the book: kernel-free sliders (precomputed frames), live sliders (kernel),
static figures. Views only: no science here.

How to write a chapter
======================
A chapter is ``book/NN_name.ipynb`` (run from ``book/``, like jupyter-book and nbval do). It imports
the package, computes through it, and shows results with the helpers below::

    import os
    from attnlab.widgets import frame_slider, frame_slider_2d, frames_from, live_slider, static_figure
    MODEL = os.environ.get("ATTNLAB_MODEL", "auto")     # the Makefile/CI set these two
    DEVICE = os.environ.get("ATTNLAB_DEVICE", "cpu")

Kernel-free slider (works on the static site; **every chapter needs at least one**: the browser test
checks that moving it changes the figure). Draw one Figure per slider value, keep them light
(a few hundred KB in all per slider; a warning tells you when frames get heavy)::

    def draw(T):                      # returns a matplotlib Figure; do not plt.show() it
        fig, ax = plt.subplots(figsize=(5, 3))
        ...
        return fig
    Ts = [0.25, 0.5, 1, 2, 4]
    frame_slider(frames_from(draw, Ts), Ts, "T", readout_format=".2f")   # last line of the cell

Two sliders (e.g. L and N): ``frames[i][j]`` is the frame for ``values1[i]``, ``values2[j]``::

    frame_slider_2d([[draw(L, N) for N in Ns] for L in Ls], Ls, Ns, "L", "N")

Budget: a grid of 6 x 6 frames at the default dpi is about 1 MB; use fewer values or a smaller
``figsize`` / ``dpi``.

Live slider (for readers running the notebook: Colab, Jupyter; it does not move on the static site,
and says so). ``update_fn`` must be cheap (recompute from a cached Trace, never a forward pass)::

    live_slider(lambda L, T: draw_from_trace(trace, L, T), L=(64, 1024, 64), T=(0.1, 4.0, 0.1))

Slider specs are ipywidgets ``interact`` abbreviations: ``(min, max, step)``, a list of values, or a
widget.

Static figure (for print/PDF and readers without JavaScript): ``static_figure(fig)`` as the last line
of a cell (or inside ``display(...)``). Figures made with ``plt.subplots`` and left open are shown by
the inline backend as usual; the helpers here close the figures they render.

Which model: ``model_note(name, device)`` as a cell's output prints "Computed with ..." and tags the
page, so ``make book`` can say which model produced the site.

Checked numbers: put ``# NBVAL_CHECK_OUTPUT`` as the first line of a cell whose output is a small,
deterministic, rounded number or table (``print(f"{x:.3f}")``); ``make nbval`` (``pytest --nbval-lax
book/``) re-runs every chapter and compares only those cells with their stored outputs. So commit
notebooks WITH outputs (at least of the checked cells), and keep each notebook small: < 1 MB (the
repository's hook rejects files > 3 MB). ``make notebooks`` (scripts/execute_notebooks.sh) re-executes
the chapters in place from ``book/``, refreshing stored outputs and widget state. Add a new chapter
to ``_toc.yml`` (``- file: book/NN_name``).

Math in a slider description: use ``\\(..\\)``, not ``$..$``.
"""
from __future__ import annotations

import base64
import io
import warnings
from typing import Any, Callable, Sequence, Union

import ipywidgets as widgets

Frame = Union[bytes, "matplotlib.figure.Figure"]  # noqa: F821

#: dpi used to render frames; 72 dpi keeps a 5 x 3 inch figure near 20-40 KB.
FRAME_DPI = 72
#: warn when one slider's frames weigh more than this (bytes, before base64).
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
    """``[fig_to_png(draw(v)) for v in values]``: one PNG frame per value, figures closed."""
    return [fig_to_png(draw(v), dpi) for v in values]


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
    total = sum(len(p) for p in pngs)
    if total > FRAME_BUDGET:
        warnings.warn(
            f"slider {description!r}: {len(pngs)} frames weigh {total / 1e3:.0f} KB "
            f"(budget {FRAME_BUDGET / 1e3:.0f} KB): use fewer values, a smaller figsize or dpi",
            stacklevel=3,
        )


class SliderBox(widgets.VBox):
    """A VBox that also offers a PNG of its first frame, so GitHub, nbconvert and PDF builds, which
    cannot run widgets, still show a figure. The book's HTML shows the live widget."""

    def __init__(self, children, fallback_png: bytes | None = None, **kwargs):
        super().__init__(children, **kwargs)
        self._fallback_png = fallback_png

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None and self._fallback_png:
            data["image/png"] = base64.b64encode(self._fallback_png).decode("ascii")
        return data


def frame_slider(frames: Sequence[Frame], values: Sequence[Any], description: str, *,
                 readout_format: str | None = None, dpi: int = FRAME_DPI) -> SliderBox:
    """Kernel-free slider over precomputed frames: ``frames[i]`` is shown at ``values[i]``.

    The slider and an ``ipywidgets.Stack`` of ``Image`` frames are joined by a ``jslink`` in the
    browser, so the static site needs no kernel. ``readout_format`` formats the values for the
    readout (``".2f"``, ``"d"``, ...)."""
    if len(frames) != len(values):
        raise ValueError(f"{description}: {len(frames)} frames for {len(values)} values")
    pngs = [fig_to_png(f, dpi) for f in frames]
    _check_budget(pngs, description)
    slider = _slider(values, description, readout_format)
    stack = widgets.Stack([_image(p) for p in pngs], selected_index=0)
    widgets.jslink((slider, "index"), (stack, "selected_index"))
    return SliderBox([slider, stack], fallback_png=pngs[0]).add_class(KERNEL_FREE_CLASS)


def frame_slider_2d(frames: Sequence[Sequence[Frame]], values1: Sequence[Any], values2: Sequence[Any],
                    description1: str, description2: str, *, readout_format1: str | None = None,
                    readout_format2: str | None = None, dpi: int = FRAME_DPI) -> SliderBox:
    """Two kernel-free sliders over a grid of frames: ``frames[i][j]`` is shown at
    (``values1[i]``, ``values2[j]``). One inner Stack per ``values1[i]`` inside an outer Stack; the
    first slider picks the inner Stack, the second is jslinked to every inner Stack."""
    if len(frames) != len(values1) or any(len(row) != len(values2) for row in frames):
        raise ValueError(
            f"{description1}/{description2}: frames must be a {len(values1)} x {len(values2)} grid")
    pngs = [[fig_to_png(f, dpi) for f in row] for row in frames]
    _check_budget([p for row in pngs for p in row], f"{description1}/{description2}")
    slider1 = _slider(values1, description1, readout_format1)
    slider2 = _slider(values2, description2, readout_format2)
    inner = [widgets.Stack([_image(p) for p in row], selected_index=0) for row in pngs]
    outer = widgets.Stack(inner, selected_index=0)
    widgets.jslink((slider1, "index"), (outer, "selected_index"))
    for stack in inner:
        widgets.jslink((slider2, "index"), (stack, "selected_index"))
    return SliderBox([slider1, slider2, outer], fallback_png=pngs[0][0]).add_class(KERNEL_FREE_CLASS)


def live_slider(update_fn: Callable[..., Any], *, dpi: int = FRAME_DPI, **slider_specs: Any) -> SliderBox:
    """Kernel sliders: ``update_fn(**values)`` returns a matplotlib Figure (or PNG bytes), redrawn
    into an Image whenever a slider is released. Specs are ``interact`` abbreviations
    (``L=(64, 1024, 64)``, ``T=[0.5, 1, 2]``) or widgets. ``update_fn`` must be cheap."""
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
    box = SliderBox([widgets.HBox(list(controls.values())), image, note], fallback_png=bytes(image.value))
    return box.add_class(LIVE_CLASS)


def static_figure(fig: Any, dpi: int = 100):
    """A plain PNG of ``fig`` (closed), for print and readers without JavaScript. Use it as the
    last line of a cell or inside ``display(...)``."""
    from IPython.display import Image

    return Image(data=fig_to_png(fig, dpi), format="png")


def model_note(model: str, device: str | None = None):
    """'Computed with model X on device Y' as a cell output; tags the page with the model so that
    ``make book`` can report which model produced the site."""
    from html import escape

    from IPython.display import HTML

    where = f" on <code>{escape(device)}</code>" if device else ""
    return HTML(f'<p class="attnlab-model" data-attnlab-model="{escape(model, quote=True)}">'
                f"Computed with model <code>{escape(model)}</code>{where}.</p>")
