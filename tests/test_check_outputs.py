"""scripts/check_outputs.py: the checked cells of a chapter against the build's executed copy."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("check_outputs", ROOT / "scripts" / "check_outputs.py")
check_outputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_outputs)


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


def test_timings_addresses_and_images_are_masked_and_nothing_else(tmp_path):
    def outputs(ms, secs, addr, png, bench, pick):
        return [{"output_type": "stream", "name": "stderr",
                 "text": f"one update of the live slider (read + draw): median {ms} ms of 5\n"},
                {"output_type": "stream", "name": "stdout", "text": f"164 claim rows; computed in {secs} s\n"},
                {"output_type": "display_data", "metadata": {},
                 "data": {"text/plain": f"<attnlab.widgets.StaticFigure at {addr}>",
                          "text/html": f'<img src="data:image/png;base64,{png}" alt="E1 = 0.25">'}},
                {"output_type": "display_data", "metadata": {},
                 "data": {"text/html": f'<td data-label="ms" style="x">{bench}</td><td data-label="× softmax">'
                                       f'{bench}</td><td data-label="median support">3</td>'}},
                {"output_type": "stream", "name": "stdout",
                 "text": f"model  L= 512 alpha=2: fastest exact method {pick} (2.0x faster than the full sort)\n"}]

    # checked, so that the cell is compared under either rule
    ref = _chapter(tmp_path / "ref.ipynb", outputs(197, 3.2, "0x7fc013c41510", "iVBOR+/=", "45.5", "topk16"),
                   tags_b=["nbval-check-output"])
    new = _chapter(tmp_path / "new.ipynb", outputs(88, 12, "0x7f0000000001", "AAAA", "1.0", "bisect"),
                   tags_b=["nbval-check-output"])
    assert check_outputs.compare(ref, new) == []
    # a number beside them is still compared: the alt text, the median support, a claim row count
    for before, after in (("E1 = 0.25", "E1 = 0.26"), (">3</td>", ">4</td>"),
                          ("164 claim rows", "163 claim rows")):
        text = new.read_text()
        changed = tmp_path / "changed.ipynb"
        changed.write_text(text.replace(before, after))
        assert text != changed.read_text() and len(check_outputs.compare(ref, changed)) == 1, before


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
    assert check_outputs.main(["--refresh", str(tmp_path / "_build"), "--book", str(book)]) == 0
    after = json.loads(ref.read_text())
    assert check_outputs.compare(ref, new) == []
    assert [c["execution_count"] for c in after["cells"][1:]] == [11, 12, 13]
    assert "16 of 16" in after["cells"][3]["outputs"][0]["data"]["text/html"]
    assert [(c["source"], c["metadata"], c["id"]) for c in after["cells"]] == \
           [(c["source"], c["metadata"], c["id"]) for c in before["cells"]]
    assert after["metadata"] == {"kernelspec": {"name": "python3"}}                 # widget state dropped
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
