"""attnlab.core.settings, the one module that reads the ATTNLAB_* environment variables (issue #47, item 4): no other
module reads one, every variable named anywhere is declared and every declared one is used and documented, values
are read at call time, `attnlab info --settings` prints them (also into a pipe), and the README's table is the
module's."""
import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.core import settings

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
SETTINGS = ROOT / "attnlab" / "core" / "settings.py"
_spec = importlib.util.spec_from_file_location("settings_table", ROOT / "scripts" / "settings_table.py")
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)
NAME = re.compile(r"\bATTNLAB_[A-Z0-9_]*[A-Z0-9]\b")


def _is_environ(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _environment_reads(source: str) -> list[tuple[int, str]]:
    """(line, code) of every read of an environment variable in `source` whose name is an ATTNLAB_ literal or not a
    literal at all (a constant such as PROGRESS_ENV): `os.environ.get(k)`, `os.environ[k]` (read), `os.getenv(k)`,
    `k in os.environ`. Writes (`os.environ[k] = v`, `setdefault`, `pop`, `del`) are left alone: the book build sets
    variables for the kernels it starts."""
    def ours(key) -> bool:
        return not (isinstance(key, ast.Constant) and isinstance(key.value, str)) or key.value.startswith("ATTNLAB_")

    reads = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if (node.func.attr == "get" and _is_environ(node.func.value)) or node.func.attr == "getenv":
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            key = node.left
        if key is not None and ours(key):
            reads.append((node.lineno, ast.unparse(node)))
    return reads


def _sources() -> list[Path]:
    return sorted([*(ROOT / "attnlab").rglob("*.py"), *(ROOT / "scripts").glob("*.py"),
                   *(ROOT / "tests").rglob("*.py")])


def test_the_scan_finds_reads_and_leaves_writes():
    source = ('import os\nos.environ.get("ATTNLAB_X", "1")\nos.environ[NAME_ENV]\nos.getenv("ATTNLAB_Y")\n'
              '"ATTNLAB_Z" in os.environ\nos.environ.get("HF_ENDPOINT")\nos.environ["ATTNLAB_W"] = "1"\n'
              'os.environ.setdefault(URL_ENV, "off")\nos.environ.pop(NAME_ENV, None)\n')
    assert [line for line, _ in _environment_reads(source)] == [2, 3, 4, 5]


def test_no_module_but_settings_reads_an_attnlab_variable():
    """In attnlab/, scripts/ and tests/; the chapters' setup cell (scripts/setup_cells.py writes it) reads
    ATTNLAB_INSTALL itself, as attnlab is not installed yet when it runs."""
    found = [f"{path.relative_to(ROOT)}:{line}: {code}" for path in _sources() if path not in (SETTINGS, HERE)
             for line, code in _environment_reads(path.read_text())]
    assert not found, "read ATTNLAB_* through attnlab.core.settings.get:\n" + "\n".join(found)


def _named(paths) -> dict[str, set]:
    """{variable: files} of every ATTNLAB_* name in `paths` (the README without its generated table)."""
    names: dict[str, set] = {}
    for path in paths:
        text = path.read_text()
        if path.name == "README.md":
            text = text.split(table.BEGIN)[0] + text.split(table.END)[1]
        for name in NAME.findall(text):
            names.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return names


def test_every_variable_named_is_declared_and_every_declared_one_is_used():
    files = [*_sources(), *(ROOT / "scripts").glob("*.sh"), *(ROOT / "book").glob("*.ipynb"),
             *(ROOT / ".github" / "workflows").glob("*.yml"), ROOT / "Makefile", ROOT / "README.md",
             ROOT / "_config.yml"]
    named = _named(p for p in files if p.is_file() and p not in (SETTINGS, HERE))
    undeclared = {name: sorted(where) for name, where in named.items() if name not in settings.BY_NAME}
    assert not undeclared, f"declare these in attnlab/core/settings.py: {undeclared}"
    assert not set(settings.BY_NAME) - set(named), "declared but named nowhere else"
    assert len(settings.ALL) == len(settings.BY_NAME) == 20


def test_every_variable_is_documented_where_its_declaration_says():
    sections = table.sections((ROOT / "README.md").read_text())
    for s in settings.ALL:
        path, _, anchor = s.documented.partition("#")
        text = sections[anchor][1] if anchor else (ROOT / path).read_text()
        assert s.name in text, f"{s.name}: not named in {s.documented}"
        assert s.meaning and (s.default is not None or s.unset), s.name


def test_values_are_read_at_call_time_and_parsed_as_before(monkeypatch, tmp_path):
    for name in settings.BY_NAME:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)      # platformdirs' Linux default: ~/.cache, as before
    assert settings.get("ATTNLAB_MODEL") == "auto" and settings.get("ATTNLAB_DEVICE") == "cpu"
    assert settings.get("ATTNLAB_CACHE_DIR") == Path.home() / ".cache" / "attnlab"
    assert settings.get("ATTNLAB_KERNELS") is True and settings.get("ATTNLAB_SYNC_DEBUG") is False
    assert settings.get("ATTNLAB_DATA_DIR") is settings.get("ATTNLAB_RESULTS_URL") is None
    assert settings.get("ATTNLAB_BOOK_JOBS") is None and settings.get("ATTNLAB_PROGRESS_LOG") is None
    monkeypatch.setenv("ATTNLAB_MODEL", "smollm2")
    monkeypatch.setenv("ATTNLAB_DATA_DIR", "")
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", "~/elsewhere")
    monkeypatch.setenv("ATTNLAB_KERNELS", "0")
    monkeypatch.setenv("ATTNLAB_SYNC_DEBUG", "yes")
    monkeypatch.setenv("ATTNLAB_RESULTS_URL", " https://example.org/book ")
    monkeypatch.setenv("ATTNLAB_BOOK_JOBS", " 3 ")
    assert settings.get("ATTNLAB_MODEL") == "smollm2" and settings.get("ATTNLAB_DATA_DIR") is None
    assert settings.get("ATTNLAB_CACHE_DIR") == Path.home() / "elsewhere"
    assert settings.get("ATTNLAB_KERNELS") is False and settings.get("ATTNLAB_SYNC_DEBUG") is False
    assert settings.get("ATTNLAB_RESULTS_URL") == "https://example.org/book/" and settings.get("ATTNLAB_BOOK_JOBS") == 3
    for off in ("", "off", "OFF", "0", "none"):
        monkeypatch.setenv("ATTNLAB_RESULTS_URL", off)
        assert settings.get("ATTNLAB_RESULTS_URL") is None
    with pytest.raises(KeyError):
        settings.get("ATTNLAB_NOT_DECLARED")


@pytest.mark.parametrize("value", ["two", "0", "-1", "1.5"])
def test_an_invalid_value_is_refused_in_one_line_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("ATTNLAB_BOOK_JOBS", value)
    with pytest.raises(ValueError) as caught:
        settings.get("ATTNLAB_BOOK_JOBS")
    says = f"ATTNLAB_BOOK_JOBS must be a positive integer (1: one chapter at a time), got {value!r}"
    assert str(caught.value) == says


def test_reading_settings_loads_no_torch():
    """The book's Sphinx extension imports it (and so do the CLI's first lines): no torch, numpy or transformers."""
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('ext', 'scripts/attnlab_book.py')\n"
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "from attnlab.core import settings\n"
            "print(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]", out.stderr


def _info_settings():
    """`attnlab info --settings` with ATTNLAB_DEVICE=cuda:1, ATTNLAB_MODEL="" and the others unset but the cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNLAB_") or k == "ATTNLAB_CACHE_DIR"}
    return subprocess.Popen([sys.executable, "-m", "attnlab.cli", "info", "--settings"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**env, "PYTHONPATH": str(ROOT), "ATTNLAB_DEVICE": "cuda:1", "ATTNLAB_MODEL": ""})


def test_info_settings_prints_every_variable_one_line_each_and_works_in_a_pipe():
    with _info_settings() as proc:
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0].split() == ["variable", "value", "default", "meaning"] and len(lines) == 1 + len(settings.ALL)
    rows = {line.split()[0]: line for line in lines[1:]}
    assert list(rows) == [s.name for s in settings.ALL]
    assert rows["ATTNLAB_DEVICE"].split()[1:3] == ["cuda:1", "cpu"]
    assert rows["ATTNLAB_DEVICE"].endswith(settings.DEVICE.meaning)
    assert rows["ATTNLAB_MODEL"].split()[1:3] == ['""', "auto"]               # set to "", shown as such
    assert rows["ATTNLAB_KERNELS"].split()[1:3] == ["-", "1"]                  # unset
    # a reader that goes away before the output comes (`attnlab info --settings | head -0`): no error, no traceback
    with _info_settings() as proc:
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=300) == 0 and err == "", err


def test_the_readme_table_is_the_modules():
    assert (ROOT / "README.md").read_text() == table.expected(), "stale: run python scripts/settings_table.py"
