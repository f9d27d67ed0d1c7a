"""scripts/check_outputs.py: the checked cells of a chapter against the build's executed copy."""
import base64
import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("check_outputs", ROOT / "scripts" / "check_outputs.py")
check_outputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_outputs)
VOLATILE_ATTR = check_outputs.VOLATILE_ATTR


def _nb(path: Path, outputs: list, tags=(), first="# NBVAL_CHECK_OUTPUT\nprint(1)") -> Path:
    cells = [{"cell_type": "code", "id": "a", "metadata": {"tags": list(tags)}, "source": first, "outputs": outputs,
              "execution_count": 1},
             {"cell_type": "code", "id": "b", "metadata": {}, "source": "print(2)", "outputs": [
                 {"output_type": "stream", "name": "stdout", "text": "anything"}], "execution_count": 2}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_equal_outputs_pass_and_merged_streams_count_as_equal(tmp_path):
    ref = _nb(tmp_path / "ref.ipynb", [{"output_type": "stream", "name": "stdout", "text": "a\n"},
                                       {"output_type": "stream", "name": "stdout", "text": "b\n"}])
    new = _nb(tmp_path / "new.ipynb", [{"output_type": "stream", "name": "stdout", "text": ["a\n", "b\n"]}])
    assert check_outputs.compare(ref, new) == []


def test_a_changed_number_in_a_checked_cell_fails_and_unchecked_cells_are_free(tmp_path):
    ref = _nb(tmp_path / "ref.ipynb", [{"output_type": "execute_result", "data": {"text/plain": "0.12"},
                                        "metadata": {}, "execution_count": 1}])
    new = _nb(tmp_path / "new.ipynb", [{"output_type": "execute_result", "data": {"text/plain": "0.13"},
                                        "metadata": {}, "execution_count": 7}])
    problems = check_outputs.compare(ref, new)
    assert len(problems) == 1 and "0.12" in problems[0] and "0.13" in problems[0]
    # the tag marks a cell as well as the comment does; images and execution counts are not compared
    ref = _nb(tmp_path / "r2.ipynb", [{"output_type": "display_data", "data": {"image/png": "AAA", "text/plain": "F"},
                                       "metadata": {}}], tags=["nbval-check-output"], first="x = 1")
    new = _nb(tmp_path / "n2.ipynb", [{"output_type": "display_data", "data": {"image/png": "BBB", "text/plain": "F"},
                                       "metadata": {}}], tags=["nbval-check-output"], first="x = 1")
    assert check_outputs.compare(ref, new) == []


def _chapter(path: Path, outputs_b: list, model="smollm2", source_b="print(2)", widgets=False, tags_b=()) -> Path:
    """A chapter: a markdown cell, the model notice (book.model_admonition's HTML) naming `model`, a checked
    cell printing a claim, and a cell `b` (unchecked unless `tags_b` say so) with `outputs_b`."""
    notice = {"output_type": "display_data", "metadata": {},
              "data": {"text/html": f'<div data-attnlab-model="{model}">model</div>', "text/plain": "<HTML>"}}
    cells = [{"cell_type": "markdown", "id": "m", "metadata": {}, "source": "# Title"},
             {"cell_type": "code", "id": "n", "metadata": {}, "source": "notice()", "outputs": [notice],
              "execution_count": 1},
             {"cell_type": "code", "id": "a", "metadata": {"tags": ["nbval-check-output"]}, "source": "check()",
              "outputs": [{"output_type": "stream", "name": "stdout", "text": "bound holds: True\n"}],
              "execution_count": 2},
             {"cell_type": "code", "id": "b", "metadata": {"tags": ["hide-input", *tags_b]}, "source": source_b,
              "outputs": outputs_b, "execution_count": 3}]
    meta = {"kernelspec": {"name": "python3"}, **({"widgets": {"state": {}}} if widgets else {})}
    path.write_text(json.dumps({"cells": cells, "metadata": meta, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _html(text: str) -> list:
    return [{"output_type": "execute_result", "execution_count": 3, "metadata": {},
             "data": {"text/html": text, "text/plain": "<IPython.core.display.HTML object>"}}]


def test_every_cell_is_compared_when_both_ran_one_model_and_only_checked_cells_otherwise(tmp_path):
    ref = _chapter(tmp_path / "ref.ipynb", _html("<td>14 of 16</td>"))
    new = _chapter(tmp_path / "new.ipynb", _html("<td>15 of 16</td>"))
    problems = check_outputs.compare(ref, new)
    assert len(problems) == 1 and "cell 3 (b)" in problems[0] and "14 of 16" in problems[0]
    # built on another model: its numbers cannot equal the stored ones; the checked cells still must
    other = _chapter(tmp_path / "other.ipynb", _html("<td>15 of 16</td>"), model="minilm")
    assert check_outputs.compare(ref, other) == []
    data = json.loads(other.read_text())
    data["cells"][2]["outputs"][0]["text"] = "bound holds: False\n"
    other.write_text(json.dumps(data))
    problems = check_outputs.compare(ref, other)
    assert len(problems) == 1 and "cell 2 (a)" in problems[0]


def test_marked_values_and_images_are_masked_and_nothing_else(tmp_path):
    from attnlab.core.style import seconds, volatile

    def outputs(ms, secs, png, bench, pick):
        return [{"output_type": "stream", "name": "stderr",
                 "text": f"one update of the live slider (read + draw): median {ms} ms of 5\n"},
                {"output_type": "display_data", "metadata": {},
                 "data": {"text/html": f"<p>164 claim rows; computed in {seconds(secs)}.</p>"}},
                {"output_type": "display_data", "metadata": {},
                 "data": {"text/plain": "[figure: E1 = 0.25]",
                          "text/html": f'<img src="data:image/png;base64,{png}" alt="E1 = 0.25">'}},
                {"output_type": "display_data", "metadata": {},
                 "data": {"text/html": f'<td data-label="ms" style="x">{volatile(bench)}</td><td data-label="× '
                                       f'softmax">{volatile(bench)}</td><td data-label="median support">3</td>'}},
                {"output_type": "display_data", "metadata": {},
                 "data": {"text/html": f"<li>model, L = 512: fastest exact method {volatile(pick)}</li>"}}]

    # checked, so that the cell is compared under either rule
    ref = _chapter(tmp_path / "ref.ipynb", outputs(197, 3.2, "iVBOR+/=", "45.5", "topk16 (2.0x faster)"),
                   tags_b=["nbval-check-output"])
    new = _chapter(tmp_path / "new.ipynb", outputs(88, 12, "AAAA", "1.0", "bisect (1.1x faster)"),
                   tags_b=["nbval-check-output"])
    assert check_outputs.compare(ref, new) == []
    # a number beside them is still compared: the alt text, the median support, a claim row count; and a duration
    # printed without the mark is compared like any number (a fresh machine's run would fail on it)
    for before, after in (("E1 = 0.25", "E1 = 0.26"), (">3</td>", ">4</td>"),
                          ("164 claim rows", "163 claim rows")):
        text = new.read_text()
        changed = tmp_path / "changed.ipynb"
        changed.write_text(text.replace(before, after))
        assert text != changed.read_text() and len(check_outputs.compare(ref, changed)) == 1, before
    unmarked = [_chapter(tmp_path / f"u{s}.ipynb", _html(f"<p>took {s} s</p>"), tags_b=["nbval-check-output"])
                for s in (23, 40)]
    assert len(check_outputs.compare(*unmarked)) == 1


def test_a_stale_build_is_reported_not_compared(tmp_path):
    ref = _chapter(tmp_path / "ref.ipynb", _html("<td>14 of 16</td>"))
    new = _chapter(tmp_path / "new.ipynb", _html("<td>14 of 16</td>"), source_b="print(3)")
    problems = check_outputs.compare(ref, new)
    assert len(problems) == 1 and "source differs" in problems[0]


def test_refresh_copies_outputs_and_execution_counts_only(tmp_path):
    book, build = tmp_path / "book", tmp_path / "_build" / "jupyter_execute" / "book"
    book.mkdir()
    build.mkdir(parents=True)
    ref = _chapter(book / "06_what_holds.ipynb", _html("<td>14 of 16</td>"), widgets=True)
    new = _chapter(build / "06_what_holds.ipynb", _html("<td>16 of 16</td>"))
    data = json.loads(new.read_text())
    for cell in data["cells"]:
        if cell["cell_type"] == "code":
            cell["execution_count"] += 10
            cell["metadata"] = {"execution": {"iopub.execute_input": "2026-01-01"}}     # not copied
    new.write_text(json.dumps(data))
    before = json.loads(ref.read_text())
    assert check_outputs.main(["--refresh", str(tmp_path / "_build"), "--book", str(book), "--cpu", "AVX2",
                               "--package", "p1"]) == 0
    after = json.loads(ref.read_text())
    assert check_outputs.compare(ref, new) == []
    assert [c["execution_count"] for c in after["cells"][1:]] == [11, 12, 13]
    assert "16 of 16" in after["cells"][3]["outputs"][0]["data"]["text/html"]
    assert [(c["source"], c["metadata"], c["id"]) for c in after["cells"]] == \
           [(c["source"], c["metadata"], c["id"]) for c in before["cells"]]
    # widget state dropped; what the outputs were made with recorded
    assert after["metadata"] == {"kernelspec": {"name": "python3"},
                                 "attnlab": {"outputs_cpu": "AVX2", "outputs_package": "p1"}}
    assert check_outputs.main([str(tmp_path / "_build"), "--book", str(book)]) == 0


def test_refresh_refuses_a_build_of_other_sources_and_writes_nothing(tmp_path):
    ref = _chapter(tmp_path / "ref.ipynb", _html("<td>14 of 16</td>"))
    new = _chapter(tmp_path / "new.ipynb", _html("<td>16 of 16</td>"), source_b="print(3)")
    text = ref.read_text()
    try:
        check_outputs.refresh(ref, new)
    except ValueError as exc:
        assert "source differs" in str(exc)
    else:
        raise AssertionError("refresh copied the outputs of other sources")
    assert ref.read_text() == text


def test_stderr_is_not_compared_and_not_kept_by_a_refresh(tmp_path):
    """As on the site (nb_output_stderr: remove): a run's stderr (a one-time "de-quantizing ... kept in <cache
    path>", a warning naming the kernel's temporary cell file) is neither compared nor stored in the chapters."""
    said = {"output_type": "stream", "name": "stderr", "text": "ipykernel_123/456.py:2: UserWarning: x\n"}
    out = {"output_type": "stream", "name": "stdout", "text": "bound holds: True\n"}
    ref = _nb(tmp_path / "ref.ipynb", [out])
    new = _nb(tmp_path / "new.ipynb", [said, out])
    assert check_outputs.compare(ref, new) == []
    check_outputs.refresh(ref, new)
    stored = json.loads(ref.read_text())["cells"][0]["outputs"]
    assert stored == [out]


# ------------------------------------------------------------- run-to-run values: marked where made, masked by mark
DURATION = re.compile(r"(?<![\w.$])(\d+(?:\.\d+)?)(\s(?:s|ms|min))(?!\w|\.\w)")   # "40 s", "0.5 ms", "3 min"
IMAGE = re.compile(r"(base64,[A-Za-z0-9+/=]+)")
MARKED = re.compile(rf"(<span\b[^>]*\b{VOLATILE_ATTR}\b[^>]*>)([^<]*)(</span>)")


def _texts(nb: dict):
    """(output, key) of every text an output holds: stream text and each text/* mime type."""
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if "text" in out:
                yield out, None
            for k in out.get("data", {}):
                if k.startswith("text/"):
                    yield out, k


def _rewrite(nb: dict, change) -> int:
    """Apply `change` (text -> text) to every text output outside embedded images; returns the outputs changed."""
    n = 0
    for out, k in _texts(nb):
        old = check_outputs._text(out["text"] if k is None else out["data"][k])
        parts = IMAGE.split(old)
        parts[::2] = [change(p) for p in parts[::2]]
        new = "".join(parts)
        n += new != old
        if k is None:
            out["text"] = new
        else:
            out["data"][k] = new
    return n


def _build_copy(tmp_path: Path, change) -> tuple[Path, int]:
    """A build folder whose executed chapters are the committed ones (the outputs of a real build, refreshed from it)
    with `change` applied to their text outputs."""
    book = tmp_path / "jupyter_execute" / "book"
    book.mkdir(parents=True)
    changed = 0
    for nb_path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        changed += _rewrite(nb, change)
        (book / nb_path.name).write_text(json.dumps(nb), encoding="utf-8")
    return tmp_path, changed


def _slower(text: str) -> str:
    """Every printed duration and every marked value changed, as on a fresh machine (another speed, another pick)."""
    text = DURATION.sub(lambda m: f"{float(m.group(1)) * 1.7 + 3:.1f}{m.group(2)}", text)
    return MARKED.sub(lambda m: m.group(1) + "other " + m.group(2)[::-1] + m.group(3), text)


def _compare_all(build: Path) -> list[str]:
    return [p for nb in sorted((ROOT / "book").glob("*.ipynb"))
            for p in check_outputs.compare(nb, build / "jupyter_execute" / "book" / nb.name)]


def test_a_real_build_whose_durations_all_differ_passes_and_one_changed_claim_number_fails(tmp_path):
    build, changed = _build_copy(tmp_path / "slow", _slower)
    assert changed >= 5, "the committed chapters print durations and marked values: the test must change some"
    assert _compare_all(build) == []

    def one_claim_number(text: str, done=[]) -> str:          # the first claim table's first measured number, +1
        m = re.search(r'(<td data-label="measured"[^>]*>[^<]*?)(\d)', text)
        if done or not m:
            return text
        done.append(1)
        return text[:m.start(2)] + str((int(m.group(2)) + 1) % 10) + text[m.end(2):]

    build, changed = _build_copy(tmp_path / "claim", lambda t: one_claim_number(_slower(t)))
    problems = _compare_all(build)
    assert len(problems) == 1 and 'data-label=\\"measured\\"' not in problems[0] and "measured" in problems[0]


def test_the_committed_chapters_print_no_memory_address_and_the_mark_is_the_packages():
    from attnlab.core.style import VOLATILE_ATTR as PACKAGE_ATTR
    from attnlab.core.style import seconds

    assert PACKAGE_ATTR == VOLATILE_ATTR and MARKED.fullmatch(seconds(12.4)).group(2) == "12 s"
    for nb_path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        for out, k in _texts(nb):
            assert not re.search(r" at 0x[0-9a-f]+", check_outputs._text(out["text"] if k is None else out["data"][k]))


def _two_panels(top: float):
    """A figure of two panels side by side, which attnlab.widgets draws a phone version of (stacked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(4, 1.5), layout="constrained")
    for ax in axes:
        ax.plot([0, 1], [0, top])
    return fig


def _output(bundle: dict) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": bundle}


def test_a_committed_figure_is_its_desktop_png_once_as_widgets_draw_one_without_a_phone_version():
    """`stored` leaves out the phone versions (a <picture>'s <source>, a slider's phone frames) and the image/png
    copy the HTML holds: the HTML left is what attnlab.widgets writes for the same desktop PNGs drawn with no phone
    version, so Jupyter, Colab and GitHub show the desktop figure, and its caption is still compared."""
    from attnlab import widgets as aw

    def without_phone(png):
        plain = aw.Rendered(bytes(png))
        plain.text_pt, plain.fig_title = png.text_pt, png.fig_title
        return plain

    figure = aw.static_figure(_two_panels(1.0), alt="two panels", caption="E1 = 0.25")
    box = aw.frame_slider([_two_panels(1.0), _two_panels(2.0)], [256, 512], r"\(L\)", readout_format="d")
    executed = [_output(figure._repr_mimebundle_()), _output(box._repr_mimebundle_())]
    assert figure.data.phone and all(" 1.5x" in o["data"]["text/html"] for o in executed)     # drawn for phones
    kept = check_outputs.stored(executed)
    plain_figure = aw.StaticFigure(without_phone(figure.data), figure.alt, figure.caption)
    pngs = [without_phone(aw.render(_two_panels(top))) for top in (1.0, 2.0)]
    plain_slider = aw.slider_html(pngs, [["256", "512"]], ["L"],
                                  "One precomputed figure per value of L: move the slider")
    assert kept[0]["data"] == {"text/html": plain_figure._repr_mimebundle_()["text/html"],
                               "text/plain": "[figure: two panels]"}
    assert kept[1]["data"]["text/html"] == plain_slider and "image/png" not in kept[1]["data"]
    assert kept[1]["data"]["application/vnd.jupyter.widget-view+json"]                   # other outputs as they are
    assert sum(len(o["data"]["text/html"]) for o in kept) < 0.6 * sum(
        len(o["data"]["text/html"]) + len(o["data"]["image/png"]) for o in executed)


def test_an_image_png_the_html_does_not_hold_is_kept_and_phone_versions_are_not_compared(tmp_path):
    png = base64.b64encode(b"\x89PNG fallback").decode()
    other = {"text/html": '<img src="data:image/png;base64,QUJD" alt="E1 = 0.25">', "image/png": png}
    assert check_outputs.stored([_output(other)])[0]["data"] == other
    phone = ('<figure><picture><source media="(max-width: 600px)" srcset="data:image/png;base64,UEhPTkU= 1.5x" '
             'width="330" height="190"><img src="data:image/png;base64,REVTSw==" alt="E1 = 0.25" data-text-pt="6" '
             'data-phone-text-pt="8"></picture><figcaption>E1 = 0.25</figcaption></figure>')
    committed = '<figure><img src="data:image/png;base64,REVTSw==" alt="E1 = 0.25" data-text-pt="6">' \
                '<figcaption>E1 = 0.25</figcaption></figure>'
    assert check_outputs.desktop_only(phone) == committed
    ref = _chapter(tmp_path / "ref.ipynb", _html(committed))
    assert check_outputs.compare(ref, _chapter(tmp_path / "new.ipynb", _html(phone))) == []
    changed = _chapter(tmp_path / "changed.ipynb", _html(phone.replace("E1 = 0.25</fig", "E1 = 0.26</fig")))
    assert len(check_outputs.compare(ref, changed)) == 1


def test_a_refresh_reports_a_chapter_over_the_size_limit(tmp_path, capsys):
    book, build = tmp_path / "book", tmp_path / "_build" / "jupyter_execute" / "book"
    book.mkdir()
    build.mkdir(parents=True)
    _chapter(book / "04_separability.ipynb", _html("<td>1</td>"))
    _chapter(build / "04_separability.ipynb", _html("<td>" + "9" * check_outputs.MAX_BYTES + "</td>"))
    assert check_outputs.main(["--refresh", str(tmp_path / "_build"), "--book", str(book)]) == 1
    assert re.search(r"04_separability.ipynb: 10\d\d KB, over 1000 KB: lighten", capsys.readouterr().out)


def test_another_cpu_class_s_last_digits_pass_once_recorded_and_nothing_else_does(tmp_path, capsys):
    """Chapter 5's Jacobian norm at T = 1e-3 printed 0.0901 on an AVX-512 Xeon and 0.0903 on an AVX2 EPYC, the
    same code and Results: a build of another CPU class passes once its last digits are recorded (`--cpu-variant`),
    only for the package the outputs were made with, only for numbers, and only on that class."""
    book, build = tmp_path / "book", tmp_path / "_build"
    executed = build / "jupyter_execute" / "book"
    book.mkdir()
    executed.mkdir(parents=True)
    name = "05_gradients.ipynb"
    variant = tmp_path / "tests" / "outputs" / "05_gradients.avx512.json"

    def build_of(cell_b: str) -> None:
        _chapter(executed / name, _html(cell_b))

    def run(*args: str) -> int:
        return check_outputs.main([*args, str(build), "--book", str(book)])

    _chapter(book / name, _html("<td>old</td>"))
    build_of("<td>||J|| = 0.0903</td><td>12 of 16</td>")                     # the AVX2 machine's build
    assert run("--refresh", "--cpu", "AVX2", "--package", "p1") == 0
    build_of("<td>||J|| = 0.0901</td><td>12 of 16</td>")                     # the same package on AVX-512
    assert run("--cpu", "AVX512", "--package", "p1") == 1
    assert "--cpu-variant" in capsys.readouterr().out
    assert run("--cpu-variant", "--cpu", "AVX512", "--package", "p2") == 1   # another package: a change may hide
    assert "package p1" in capsys.readouterr().out and not variant.exists()
    assert run("--cpu-variant", "--cpu", "AVX2", "--package", "p1") == 1     # the class the outputs were made on
    assert not variant.exists()
    assert run("--cpu-variant", "--cpu", "AVX512", "--package", "p1") == 0
    assert json.loads(variant.read_text())["cells"].keys() == {"b"}
    assert run("--cpu", "AVX512") == 0
    assert run("--cpu", "AVX2") == 1                                          # the variant is AVX-512's alone
    build_of("<td>||J|| = 0.0901</td><td>13 of 16</td>")                     # a real change on AVX-512
    assert run("--cpu", "AVX512") == 1
    build_of("<td>||J|| = 0.0901</td><td>12 of 16 heads</td>")               # text, not a number: never a variant
    assert run("--cpu-variant", "--cpu", "AVX512", "--package", "p1") == 1
    assert "not only its numbers" in capsys.readouterr().out

    # a refresh on AVX-512 makes its digits the committed ones and keeps AVX2's as AVX2's variant
    build_of("<td>||J|| = 0.0901</td><td>12 of 16</td>")
    assert run("--refresh", "--cpu", "AVX512", "--package", "p1") == 0
    assert not variant.exists() and run("--cpu", "AVX512") == 0
    build_of("<td>||J|| = 0.0903</td><td>12 of 16</td>")
    assert run("--cpu", "AVX2") == 0
    # a refresh that changes the cell leaves no variant of the old outputs beside it
    build_of("<td>||J|| = 0.0901</td><td>14 of 16</td>")
    assert run("--refresh", "--cpu", "AVX512", "--package", "p3") == 0
    assert not list((tmp_path / "tests" / "outputs").glob("*.json"))


def test_every_cpu_variant_stands_beside_the_committed_outputs():
    """A variant (tests/outputs/NAME.<class>.json) whose `of` no longer matches its chapter's committed outputs is
    ignored by the check: a refresh prunes such entries, so one found here was edited or left behind."""
    for path in sorted((ROOT / "tests" / "outputs").glob("*.json")):
        body = json.loads(path.read_text(encoding="utf-8"))
        chapter = json.loads((ROOT / "book" / body["notebook"]).read_text(encoding="utf-8"))
        assert path.name == f"{Path(body['notebook']).stem}.{body['cpu'].lower()}.json"
        assert body["cpu"] != check_outputs.made_with(chapter)["outputs_cpu"], path.name
        cells = {c.get("id"): c for c in chapter["cells"] if c["cell_type"] == "code"}
        for cid, entry in body["cells"].items():
            assert entry["of"] == check_outputs.digest(check_outputs.normalized(cells[cid]["outputs"])), (path, cid)
