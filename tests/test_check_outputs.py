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
