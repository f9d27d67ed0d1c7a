"""scripts/attnlab_book.py's `_execute_ahead`: before Sphinx reads the pages, the chapters the execution cache lacks
run two kernels at a time into that cache, so myst-nb finds each one cached and executes none itself (a toy book
of three tiny notebooks, built by Sphinx with myst-nb and the extension, as jupyter-book builds the real one)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("attnlab_book", ROOT / "scripts" / "attnlab_book.py")
ext = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ext)

CELL = """
import os, time
from pathlib import Path
toy = Path(os.environ["TOY_DIR"])
(toy / "started-{me}").touch()
with open(toy / "executions", "a") as fh:
    fh.write("{me}\\n")
end = time.time() + {wait}
while {wait} and not (toy / "started-{other}").exists():     # the other chapter's kernel runs beside this one
    assert time.time() < end, "{other} did not run beside {me}"
    time.sleep(0.05)
print("{me} done", "threads", os.environ.get("OMP_NUM_THREADS"), os.environ.get("NUMBA_NUM_THREADS"))
"""


def _toy_book(src: Path) -> None:
    src.mkdir()
    (src / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
                                 "extensions = ['myst_nb', 'attnlab_book']\nnb_execution_mode = 'cache'\n"
                                 "master_doc = 'index'\nexclude_patterns = ['_build']\n")
    (src / "index.md").write_text("# Toy\n\n```{toctree}\na\nb\nc\n```\n")
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    for me, other, wait in (("a", "b", 90), ("b", "a", 90)):
        nb = nbformat.v4.new_notebook(metadata=kernel, cells=[
            nbformat.v4.new_markdown_cell(f"# Chapter {me}"),
            nbformat.v4.new_code_cell(CELL.format(me=me, other=other, wait=wait))])
        nbformat.write(nb, src / f"{me}.ipynb")
    # a MyST markdown notebook (as the book's landing and closing pages are)
    (src / "c.md").write_text("---\njupytext:\n  text_representation:\n    format_name: myst\nkernelspec:\n"
                              "  display_name: Python 3\n  language: python\n  name: python3\n---\n\n# Chapter c\n\n"
                              "```{code-cell} ipython3\n" + CELL.format(me="c", other="a", wait=0).strip() + "\n```\n")


def test_stale_chapters_run_two_at_a_time_into_the_cache_sphinx_then_reads(tmp_path):
    _toy_book(tmp_path / "src")
    env = {k: v for k, v in os.environ.items() if k not in (ext.PROGRESS_ENV, "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
    env.update(PYTHONPATH=str(ROOT), ATTNLAB_CACHE_DIR=str(tmp_path / "cache"), TOY_DIR=str(tmp_path),
               ATTNLAB_BOOK_JOBS="2", ATTNLAB_BOOK_FILL="off")          # the toy chapters read no Result

    def build(out: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sphinx", "-b", "text", str(tmp_path / "src"),
                               str(tmp_path / out)], env=env, capture_output=True, text=True, timeout=600)

    done = build("out")
    assert done.returncode == 0, done.stderr[-3000:]
    # a and b ran side by side (each waited for the other to start), c after them; each once
    assert sorted((tmp_path / "executions").read_text().split()) == ["a", "b", "c"]
    lines = done.stdout + done.stderr
    assert "attnlab: 3 notebooks to execute, 2 at a time (ATTNLAB_BOOK_JOBS=2" in lines
    for me in ("a.ipynb", "b.ipynb", "c.md"):
        assert f"attnlab: executing {me}" in lines and f"attnlab: executed {me} in " in lines
        # the page shows its output; kernels side by side run torch and numba on one thread each
        assert f"{me[0]} done threads 1 1" in (tmp_path / "out" / f"{me[0]}.txt").read_text()
    assert "Executing notebook" not in lines and lines.count("Using cached notebook") == 3   # myst-nb ran none
    if ext._kernel_config():               # CurveZMQ provisioned: ipykernel has no plain-TCP warning to print
        assert "running over TCP without encryption" not in lines, lines[-3000:]
    # the executed copies (what scripts/check_outputs.py compares) hold the outputs, not the unexecuted sources
    for me in ("a", "b"):
        copy = nbformat.read(tmp_path / "jupyter_execute" / f"{me}.ipynb", as_version=4)
        assert f"{me} done" in "".join(o.get("text", "") for o in copy.cells[1].outputs)

    again = build("out2")                                     # a new build of the same sources: all cached
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted((tmp_path / "executions").read_text().split()) == ["a", "b", "c"]
    assert "attnlab: executing" not in again.stdout + again.stderr


def test_the_fill_runs_before_the_chapters_in_a_process_of_its_own(monkeypatch, capsys):
    """`_fill_results`: `attnlab results compute --book` for the build's model, serial by default, on a local cluster
    when ATTNLAB_BOOK_FILL says, nothing when it says off; a fill that fails is one line and the build goes on."""
    runs = []

    def run(command, **kwargs):
        assert "ATTNLAB_RESULTS_LOG" not in kwargs["env"]       # the build's record holds what the chapters read
        runs.append(command)
        out = "smollm2, the book's window: 3 stored, 40 computed\nminilm, W&P #1: 0 stored, 6 computed\n"
        return subprocess.CompletedProcess(command, 2 if "local:2" in command else 0, out, "attnlab: boom\n")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setenv("ATTNLAB_MODEL", "smollm2")
    monkeypatch.setenv("ATTNLAB_RESULTS_LOG", "/nonexistent/results-used.txt")
    monkeypatch.delenv(ext.PROGRESS_ENV, raising=False)
    monkeypatch.delenv(ext.FILL_ENV, raising=False)
    assert ext._fill_results(5) is True                   # it ran to its end: `_jobs` may run two chapters at once
    assert runs[-1][1:] == ["-m", "attnlab", "results", "compute", "--book", "--model", "smollm2", "--device", "cpu",
                            "--quiet"] and ext.DEFAULT_FILL == "serial"
    err = capsys.readouterr().err
    assert "filled 2 tasks in" in err and "46 Results computed" in err
    monkeypatch.setenv(ext.FILL_ENV, "local:2")
    assert ext._fill_results(5) is False
    assert runs[-1][-2:] == ["--cluster", "local:2"]
    assert "the fill stopped after" in capsys.readouterr().err
    monkeypatch.setenv(ext.FILL_ENV, "off")
    assert ext._fill_results(5) is False
    assert len(runs) == 2
    monkeypatch.setenv(ext.FILL_ENV, "sometimes")
    with pytest.raises(ValueError, match="ATTNLAB_BOOK_FILL must be off, serial, auto or local:N"):
        ext._fill_results(5)


def test_two_at_a_time_only_when_every_result_read_last_time_is_stored(tmp_path, monkeypatch):
    monkeypatch.delenv(ext.JOBS_ENV, raising=False)
    results = tmp_path / "results"
    (results / "fig2a-0123").mkdir(parents=True)
    (results / "fig2a-0123" / "key.json").write_text("{}")
    assert ext._jobs({"fig2a-0123"}, results, cpus=2)[0] == 1     # a key without its Result: not stored
    (results / "fig2a-0123" / "fig2a.json").write_text("{}")
    (results / "fig2a-0123" / "key.json").unlink()                 # a Result whose key file a stopped run never wrote
    assert ext._jobs({"fig2a-0123"}, results, cpus=2)[0] == 2
    assert ext._jobs({"fig2a-0123"}, results, cpus=1)[0] == 1
    jobs, why = ext._jobs({"fig2a-0123", "perplexity-4567"}, results, cpus=2)
    assert jobs == 1 and "1 of the 2 Results" in why and "perplexity-4567" in why
    assert ext._jobs(set(), results, cpus=2)[0] == 1                         # no record: one at a time
    monkeypatch.setenv(ext.JOBS_ENV, "1")
    assert ext._jobs({"fig2a-0123"}, results, cpus=2)[0] == 1
    monkeypatch.setenv(ext.JOBS_ENV, "3")
    assert ext._jobs(set(), results, cpus=2)[0] == 3
    monkeypatch.setenv(ext.JOBS_ENV, "two")
    with pytest.raises(ValueError, match="ATTNLAB_BOOK_JOBS must be a positive integer"):
        ext._jobs(set(), results, cpus=2)


def test_two_at_a_time_after_a_fill_without_a_record(tmp_path, monkeypatch):
    """A fill that ran to its end stored what the chapters read (they compute only `results.BOOK_NOT_PLANNED`'s cheap
    Results): two at a time with no record, and the line says why; ATTNLAB_BOOK_JOBS still chooses; one core: one."""
    from attnlab import results as plan

    monkeypatch.delenv(ext.JOBS_ENV, raising=False)
    store = tmp_path / "results"
    jobs, why = ext._jobs(set(), store, cpus=2, filled=True)
    assert jobs == 2 and why.startswith("the fill just stored the Results the chapters read")
    assert all(name in why for name in plan.BOOK_NOT_PLANNED)
    assert ext._jobs({"fig2a-0123"}, store, cpus=2, filled=True)[0] == 2      # a record of absent Results: the fill's
    assert ext._jobs(set(), store, cpus=1, filled=True)[0] == 1
    assert ext._jobs(set(), store, cpus=2, filled=False)[0] == 1              # no fill, no record: one at a time
    monkeypatch.setenv(ext.JOBS_ENV, "1")
    assert ext._jobs(set(), store, cpus=2, filled=True) == (1, f"{ext.JOBS_ENV}=1")


def test_the_results_read_by_a_dropped_execution_cache_count_as_read_last_time(tmp_path):
    old = tmp_path / "auto-cpu-0123456789ab"
    old.mkdir()
    (old / "results-used.txt").write_text("fig2a-0123\nfig2a-0123\nperplexity-4567\n")
    assert ext._results_used(old) == {"fig2a-0123", "perplexity-4567"}
    assert ext._results_used(tmp_path / "none") == set()
