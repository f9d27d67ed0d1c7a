"""attnlab.widgets: frames, kernel-free sliders (jslinked, no kernel), live sliders, static figures."""
import base64
import warnings

import ipywidgets as widgets
import matplotlib
from ipywidgets.widgets.widget_link import Link

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from attnlab import widgets as aw  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _fig(value=0.0):
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1], [0, value])
    return fig


def _links(box):
    """jslinks whose both ends are inside `box` (Link widgets are not children, so search)."""
    ids = set()

    def walk(w):
        ids.add(w.model_id)
        for c in getattr(w, "children", ()):
            walk(c)

    walk(box)
    instances = getattr(widgets.widget, "_instances", None) or widgets.Widget.widgets
    return [w for w in list(instances.values())
            if isinstance(w, Link) and w.source[0].model_id in ids and w.target[0].model_id in ids]


def test_fig_to_png_closes_and_is_fixed_size():
    fig = _fig()
    n_open = len(plt.get_fignums())
    png = aw.fig_to_png(fig, dpi=50)
    assert png.startswith(PNG_MAGIC)
    assert len(plt.get_fignums()) == n_open - 1
    assert aw.fig_to_png(png) == png  # bytes pass through
    assert b"Software" not in png[:200]  # no matplotlib version in the file
    # same figure size -> same pixel size, whatever is drawn
    a, b = aw.fig_to_png(_fig(0), dpi=50), aw.fig_to_png(_fig(1e6), dpi=50)
    assert a[16:24] == b[16:24]  # IHDR width and height


def test_frames_from_renders_each_value():
    frames = aw.frames_from(_fig, [0, 1, 2], dpi=40)
    assert len(frames) == 3 and all(f.startswith(PNG_MAGIC) for f in frames)


def test_frame_slider_is_jslinked_stack_of_images():
    box = aw.frame_slider([_fig(v) for v in (0, 1, 2)], [0.5, 1.0, 2.0], "T", readout_format=".1f")
    slider, stack = box.children
    assert isinstance(slider, widgets.SelectionSlider)
    assert slider.label == "0.5" and slider.index == 0
    assert [label for label, _ in slider.options] == ["0.5", "1.0", "2.0"]
    assert isinstance(stack, widgets.Stack) and stack.selected_index == 0
    assert all(isinstance(c, widgets.Image) and bytes(c.value).startswith(PNG_MAGIC) for c in stack.children)
    links = _links(box)
    assert [(l.source[0], l.source[1], l.target[0], l.target[1]) for l in links] == [
        (slider, "index", stack, "selected_index")]
    assert aw.KERNEL_FREE_CLASS in box._dom_classes


def test_frame_slider_offers_a_png_fallback():
    box = aw.frame_slider([_fig(0)], [1], "T")
    bundle = box._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"]).startswith(PNG_MAGIC)


def test_frame_slider_2d_links_both_sliders():
    grid = [[_fig(i + j) for j in range(3)] for i in range(2)]
    box = aw.frame_slider_2d(grid, [64, 128], [1, 2, 4], "L", "N")
    s1, s2, outer = box.children
    assert len(outer.children) == 2 and all(len(inner.children) == 3 for inner in outer.children)
    pairs = {(l.source[0].model_id, l.target[0].model_id) for l in _links(box)}
    assert (s1.model_id, outer.model_id) in pairs
    assert all((s2.model_id, inner.model_id) in pairs for inner in outer.children)
    assert len(pairs) == 1 + 2


def test_frame_slider_input_errors():
    with pytest.raises(ValueError, match="2 frames for 3 values"):
        aw.frame_slider([b"x", b"y"], [1, 2, 3], "T")
    with pytest.raises(ValueError, match="not unique"):
        aw.frame_slider([b"x", b"y"], [1.01, 1.02], "T", readout_format=".1f")
    with pytest.raises(ValueError, match="grid"):
        aw.frame_slider_2d([[b"x"], [b"y", b"z"]], [1, 2], [1], "L", "N")


def test_frame_slider_warns_over_budget(monkeypatch):
    monkeypatch.setattr(aw, "FRAME_BUDGET", 10)
    with pytest.warns(UserWarning, match="budget"):
        aw.frame_slider([PNG_MAGIC + b"0" * 20], [1], "T")


def test_the_budget_counts_the_frames_a_committed_chapter_stores_not_their_phone_versions(monkeypatch):
    monkeypatch.setattr(aw, "FRAME_BUDGET", 100)
    frame = aw.Rendered(PNG_MAGIC + b"0" * 50)
    frame.phone = PNG_MAGIC + b"1" * 500                   # the build keeps it for the site, the chapter does not
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        aw.frame_slider([frame], [1], "T")
    with pytest.warns(UserWarning, match="budget"):
        aw.frame_slider([frame, frame], [1, 2], "T")


def test_live_slider_redraws_on_change():
    calls = []

    def update(T, L):
        calls.append((T, L))
        return _fig(T)

    box = aw.live_slider(update, T=(0.5, 2.0, 0.5), L=[8, 16])
    controls, image, note = box.children
    assert calls and isinstance(image, widgets.Image) and bytes(image.value).startswith(PNG_MAGIC)
    t_slider = controls.children[0]
    assert t_slider.description == "T" and t_slider.continuous_update is False
    before = bytes(image.value)
    t_slider.value = 2.0
    assert calls[-1][0] == 2.0 and bytes(image.value) != before
    assert aw.LIVE_CLASS in box._dom_classes
    with pytest.raises(ValueError):
        aw.live_slider(update)


def test_static_figure_and_model_note():
    img = aw.static_figure(_fig())
    assert img.data.startswith(PNG_MAGIC)
    html = aw.model_note("gpt2", "cuda")._repr_html_()
    assert 'data-attnlab-model="gpt2"' in html and "cuda" in html
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert '"&lt;x&gt;"' in aw.model_note("<x>")._repr_html_()

    class Model:
        name, device = "minilm", "cpu"

    html = aw.model_note(Model())._repr_html_()
    assert 'data-attnlab-model="minilm"' in html and "<code>cpu</code>" in html


def test_static_site_html_of_sliders_and_figures():
    """What the site shows (text/html): a kernel-free slider as range inputs over data-URI frames with
    alt text per frame; a live slider as its figure and how to run it; a figure with alt text."""
    import json
    import re

    pngs = [aw.fig_to_png(_fig(t)) for t in (1, 2, 3)]
    html = aw.slider_html(pngs, [["a", "b", "c"]], ["T"], "demo")
    assert html.count('type="range"') == 1 and 'max="2"' in html and html.count("data:image/png") == 3
    payload = json.loads(re.search(r'<script type="application/json">(.*?)</script>', html).group(1))
    assert payload["alts"] == ["demo (T = a)", "demo (T = b)", "demo (T = c)"] and payload["frames"][0] is None
    bundle = aw.frame_slider(pngs, [1, 2, 3], r"\(T\)")._repr_mimebundle_()
    assert aw.KERNEL_FREE_CLASS in bundle["text/html"] and "image/png" in bundle
    assert 'aria-label="T"' in bundle["text/html"]                     # LaTeX delimiters dropped
    grid = aw.frame_slider_2d([pngs[:2], pngs[1:]], [1, 2], ["x", "y"], "L", "N")._repr_mimebundle_()
    assert grid["text/html"].count('type="range"') == 2
    live = aw.live_slider(lambda T: _fig(T), T=(0.5, 2.0, 0.5))._repr_mimebundle_()["text/html"]
    assert "run this chapter" in live and "<input" not in live and aw.LIVE_CLASS in live
    fig = _fig(1.0)
    fig.suptitle("a title")
    page = aw.static_figure(fig)._repr_mimebundle_()
    assert 'alt="a title"' in page["text/html"] and page["image/png"]


# ------------------------------------------------------------------------------------ phone versions

def _panels(n, legend=True, colorbar=False):
    fig, axes = plt.subplots(1, n, figsize=(9, 2.6), layout="constrained")
    for i, ax in enumerate(axes):
        ax.plot([0, 1], [0, i], label=f"a rather long legend entry {i}")
        ax.set_title(f"panel {i}")
        ax.tick_params(labelsize=6)                       # too small for a phone
        if legend:
            ax.legend()
    if colorbar:
        fig.colorbar(axes[0].imshow([[0, 1], [1, 0]]), ax=axes[0])
    fig.suptitle("a suptitle long enough to run off a phone-wide figure unless it wraps onto a second line")
    return fig


def test_render_stacks_the_panels_for_a_phone_with_legible_text():
    before = set(plt.get_fignums())           # figures another test of this worker left open are not render's
    out = aw.render(_panels(3))
    w, h = aw._png_size(out)
    pw, ph = aw._png_size(out.phone)
    assert (w, h) == (900, 260)                                     # the desktop figure as drawn
    assert pw == round(aw.PHONE_WIDTH_IN * aw.PHONE_DPI)            # the phone column, at 1.5 px per CSS px
    assert ph > 3 * 1.9 * aw.PHONE_DPI                              # three panels stacked, each at least 1.9 in
    assert out.text_pt == 6 and out.phone_text_pt >= aw.PHONE_MIN_PT
    assert aw.PHONE_MIN_PT * aw.FRAME_DPI / 72 >= 11                # points to CSS px on the phone
    assert set(plt.get_fignums()) == before                         # its figure closed


def test_render_leaves_layouts_it_cannot_stack_alone():
    assert aw.render(_panels(2, colorbar=True)).phone is not None  # constrained layout places the colorbar again
    fig, (a, b) = plt.subplots(1, 2)
    fig.colorbar(a.imshow([[0, 1], [1, 0]]), ax=a)                  # placed by hand (no layout engine)
    assert aw.render(fig).phone is None
    assert aw.render(b"\x89PNG plain bytes").phone is None


def test_a_rendered_figure_is_a_picture_phones_take_their_version_of():
    html = aw.static_figure(_panels(2), alt="two panels")._repr_mimebundle_()["text/html"]
    assert html.startswith('<figure class="attnlab-fig"') and "<figcaption" in html and "two panels" in html
    assert '<picture><source media="(max-width: 600px)"' in html
    assert 'srcset="data:image/png;base64,' in html and ' 1.5x"' in html
    assert f'width="{round(aw.PHONE_WIDTH_IN * aw.FRAME_DPI)}"' in html   # shown at the column's width in CSS px
    assert 'data-text-pt="6"' in html and 'data-phone-text-pt="8"' in html


def test_slider_frames_carry_their_phone_versions_and_announce_their_value():
    box = aw.frame_slider([_panels(2), _panels(2)], [256, 512], "L", readout_format="d")
    html = box._repr_mimebundle_()["text/html"]
    assert html.count("<source") == 1 and '"phone": [null, "data:image/png;base64,' in html
    assert 'aria-valuetext="L = 256"' in html and 'setAttribute("aria-valuetext"' in html


def test_frames_drawn_as_figures_say_what_each_shows():
    frames = []
    for T in (1, 2):
        fig = _fig(T)
        fig.axes[0].set_title(f"slope {T}")
        frames.append(fig)
    html = aw.frame_slider(frames, [1, 2], "T")._repr_mimebundle_()["text/html"]
    assert 'alt="One precomputed figure per value of T: move the slider (T = 1): slope 1"' in html
    assert '(T = 2): slope 2"' in html                                # the second frame's alt, in the payload
    assert aw.static_figure(aw.render(_titled())).alt == "a book.png title"      # bytes that remember the title


def _titled():
    fig = _fig(1.0)
    fig.suptitle("a book.png title")
    return fig


def test_a_live_sliders_page_figure_has_its_phone_version_unless_the_figure_is_kept():
    html = aw.live_slider(lambda T: _panels(2), T=(0.5, 2.0, 0.5))._repr_mimebundle_()["text/html"]
    assert "<picture><source" in html                                 # a new Figure per call: drawn for phones too
    kept = _panels(2)
    html = aw.live_slider(lambda T: kept, T=(0.5, 2.0, 0.5))._repr_mimebundle_()["text/html"]
    assert "<picture" not in html and kept.get_size_inches()[0] == 9  # a kept Figure is never re-laid out


def test_a_live_slider_is_a_numbered_figure_with_a_caption_and_a_phone_version():
    """On the site a live slider's figure is a figure with its caption (the build numbers it), drawn for phones
    too: from `update_fn.new_figure` when `update_fn` redraws one kept Figure into PNG bytes, and as returned
    when `update_fn` returns a Rendered PNG (book.png)."""
    kept = _panels(2)

    def draw(T):
        return aw.fig_to_png(kept, close=False)

    draw.new_figure = lambda T: _panels(2)
    html = aw.live_slider(draw, caption="two panels", T=(0.5, 2.0, 0.5))._repr_mimebundle_()["text/html"]
    assert "<picture><source" in html and kept.get_size_inches()[0] == 9
    assert f'<figure class="{aw.FIGURE_CLASS}"' in html and '<figcaption class="attnlab-caption">two panels<' in html
    html = aw.live_slider(lambda T: aw.render(_panels(2)), T=(0.5, 2.0, 0.5))._repr_mimebundle_()["text/html"]
    assert "<picture><source" in html and "<figcaption" in html


def test_a_phone_version_keeps_long_x_labels_and_figure_legends_inside_the_image():
    """Fig. 6.2's x label ran off the phone image ("... farthest from th"); a figure legend of 3 columns too."""
    fig = _panels(2)
    fig.axes[1].set_xlabel("p1-fig3-saturation: median N_s/N farthest from the band, a label that is long")
    fig.axes[0].plot([0, 1], [0, 1], label="sa_softmax(variant=normalized)")
    fig.axes[0].plot([0, 1], [1, 0], label="ssmax(ref_length=64)")
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2)
    assert aw.phone_layout(fig)
    fig.draw_without_rendering()
    width = fig.bbox.width
    for artist in [ax.xaxis.label for ax in fig.axes] + list(fig.legends):
        box = artist.get_window_extent()
        assert box.x0 >= -1 and box.x1 <= width + 1, (artist, box, width)
    assert "\n" in fig.axes[1].get_xlabel()
