"""tests/golden is append-only: a golden file, once committed, keeps the numbers it was added with (a change that moves
numbers bumps the computation's version or the probe's label, which adds a file; see tests/test_golden.py). Compared
as parsed JSON (`canonical`), so a commit that only reformats a file passes; the working tree is compared, so an
uncommitted edit fails too. Skipped without git or without the history (a shallow clone)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# files whose parsed content changed once after they were added, legitimately: compared with that commit's content
REWRITTEN = {
    # 892f85b: empty (null) cells left out of the comparison (core.result.numbers); same numbers, fewer null cells
    "bench_normalizers@v1.json": "892f85b",
    "diagnose@v1.json": "892f85b",
}


def canonical(text: str) -> str:
    """The parsed JSON, written one way (NaN compares equal to NaN, layout and key order do not matter)."""
    return json.dumps(json.loads(text), sort_keys=True)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def edited(root: Path, rewritten: dict[str, str] = REWRITTEN) -> list[str]:
    """The files of root/tests/golden whose content differs from the content they were added with (or from their
    `rewritten` commit's); a file never committed is new, not edited."""
    out = []
    for path in sorted((root / "tests" / "golden").glob("*.json")):
        rel = path.relative_to(root).as_posix()
        added = _git(root, "log", "--diff-filter=A", "--format=%H", "--", rel).split()
        if not added:
            continue
        base = rewritten.get(path.name, added[-1])                # the oldest commit that added it
        if canonical(_git(root, "show", f"{base}:{rel}")) != canonical(path.read_text(encoding="utf-8")):
            out.append(path.name)
    return out


def _history_or_skip(root: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    try:
        shallow = _git(root, "rev-parse", "--is-shallow-repository").strip()
    except subprocess.CalledProcessError:
        pytest.skip(f"{root} is not a git checkout")
    if shallow != "false":
        pytest.skip("a shallow clone: the commits that added the golden files are not here (git fetch --unshallow)")


def test_no_golden_file_was_edited():
    _history_or_skip(ROOT)
    changed = edited(ROOT)
    assert not changed, (f"golden files edited after they were added: {changed}. A golden file is append-only: "
                         "restore it (git checkout) and bump the computation's version, or give a changed probe a "
                         "new label (tests/test_golden.py)")


def test_an_edit_is_found_and_a_reformat_is_not(tmp_path):
    """`edited` on a repository made here: a reformatted file passes, a moved number and an uncommitted edit fail."""
    _history_or_skip(ROOT)
    golden = tmp_path / "tests" / "golden"
    golden.mkdir(parents=True)
    f = golden / "x@v1.json"

    def commit(message):
        _git(tmp_path, "add", "-A")
        _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    _git(tmp_path, "init", "-q")
    f.write_text('{"computation": "x", "version": 1, "rows": [{"a": 1.5, "b": NaN}]}\n')
    commit("add")
    f.write_text('{"computation": "x",\n "version": 1,\n "rows": [\n{"b": NaN, "a": 1.5}\n]}\n')
    commit("reformat")
    assert edited(tmp_path) == []
    (golden / "y@v1.json").write_text('{"rows": []}')                        # new, uncommitted: not an edit
    assert edited(tmp_path) == []
    f.write_text('{"computation": "x", "version": 1, "rows": [{"a": 1.6, "b": NaN}]}\n')
    assert edited(tmp_path) == ["x@v1.json"]                                  # uncommitted
    commit("edit")
    assert edited(tmp_path) == ["x@v1.json"]                                  # committed
    assert edited(tmp_path, {"x@v1.json": _git(tmp_path, "rev-parse", "HEAD").strip()}) == []
