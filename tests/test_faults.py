"""Faults injected into what attnlab writes to disk: nothing damaged is served, nothing is written half."""
import os
import threading
import warnings

import pytest

from attnlab.core import cache, util
from attnlab.core.result import CorruptResult, Result


def _result(tag: float = 1.0, n: int = 24) -> Result:
    return Result("demo", [{"L": 32 * (i + 1), "value": tag * i / 7, "ok": i % 2 == 0} for i in range(n)],
                  {"model": "m", "tag": tag})


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """A Result stored in an empty results cache; returns (folder, key, calls to compute)."""
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    calls = []
    key = {"figure": "demo", "version": 1}

    def compute():
        calls.append(1)
        return _result()

    cache.cached("demo", key, compute, version=1)
    folder = tmp_path / f"demo-{cache.key_hash(key)}"
    assert calls == [1] and (folder / "demo.csv").is_file()
    return folder, key, compute, calls


def _damage(folder, how: str) -> None:
    csv, meta = folder / "demo.csv", folder / "demo.json"
    if how == "truncated":
        csv.write_bytes(csv.read_bytes()[: len(csv.read_bytes()) // 2])
    elif how == "emptied":
        csv.write_bytes(b"")
    elif how == "edited":
        csv.write_bytes(csv.read_bytes().replace(b"0.14285714285714285", b"0.15285714285714285"))
    elif how == "missing csv":
        csv.unlink()
    elif how == "corrupt json":
        meta.write_text("{not json")
    elif how == "missing json":
        meta.unlink()
    elif how == "edited provenance":                # was: served with the edited provenance
        meta.write_text(meta.read_text().replace('"tag": 1.0', '"tag": 2.0'))
    elif how == "csv is a fifo":                    # was: the read blocked forever
        csv.unlink()
        os.mkfifo(csv)
    elif how == "json links to /dev/zero":          # was: a read without end (then a MemoryError)
        meta.unlink()
        meta.symlink_to("/dev/zero")


@pytest.mark.parametrize("how", ["truncated", "emptied", "edited", "missing csv", "corrupt json", "missing json",
                                 "edited provenance", "csv is a fifo", "json links to /dev/zero"])
def test_a_damaged_cached_result_is_a_miss_with_one_warning(stored, how):
    folder, key, compute, calls = stored
    _damage(folder, how)
    if how != "missing json":                   # a lone CSV is a miss as well, but not worth a warning
        with pytest.raises(CorruptResult):
            Result.load(folder, "demo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = cache.cached("demo", key, compute, version=1)
    assert calls == [1, 1], "recomputed"
    assert not again.provenance.get("loaded_from_cache") and len(again.rows) == 24
    assert len([w for w in caught if "attnlab cache" in str(w.message)]) == 1
    assert Result.load(folder, "demo").rows == again.rows            # stored again, and verified


def test_an_intact_result_round_trips(tmp_path):
    r = _result()
    r.save(tmp_path)
    back = Result.load(tmp_path, "demo")
    assert back.rows == r.rows and back.provenance == r.provenance


def test_a_kill_during_a_save_keeps_the_previous_files_and_leaves_no_temporary(tmp_path, monkeypatch):
    _result(1.0).save(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = util.os.replace
    calls = []

    def killed(src, dst):                     # the process dies after the CSV, before the JSON
        calls.append(dst)
        if str(dst).endswith(".json"):
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(util.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        _result(2.0).save(tmp_path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before)   # no .part file left behind
    with pytest.raises(CorruptResult):        # a new CSV with the old JSON: refused, not mixed
        Result.load(tmp_path, "demo")


def test_two_concurrent_writers_never_yield_a_wrong_result(tmp_path):
    """Two writers saving different tables into one folder, a reader loading all the while: every load
    is one writer's whole table or a refusal, never a mix (57 collisions and 179 mismatched pairs before)."""
    tables = {tag: _result(tag).rows for tag in (1.0, 2.0)}
    errors, seen = [], []

    def write(tag):
        try:
            for _ in range(60):
                _result(tag).save(tmp_path)
        except Exception as exc:              # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    def read():
        for _ in range(200):
            try:
                r = Result.load(tmp_path, "demo")
            except CorruptResult:
                seen.append("refused")
                continue
            seen.append("ok" if r.rows in tables.values() else "WRONG")

    _result(1.0).save(tmp_path)
    threads = [threading.Thread(target=write, args=(t,)) for t in tables] + [threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and "WRONG" not in seen and "ok" in seen
    assert not [p.name for p in tmp_path.iterdir() if p.suffix == ".part"]


def test_a_bad_out_fails_at_once_with_one_line(tmp_path, capsys, no_model_loads):
    """Before any computation (no model is loaded), exit 2 and one line."""
    from attnlab.cli import main

    a_file = tmp_path / "taken"
    a_file.write_text("x")
    for argv in (["figures", "fig1", "--model", "tiny-gpt2", "--out", str(a_file)],
                 ["figures", "fig1", "--model", "tiny-gpt2", "--out", str(a_file / "sub")],
                 ["diagnose", "--model", "tiny-gpt2", "--out", str(a_file)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "--out" in err, err


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    from attnlab import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", lambda: _parser_with(interrupted))
    assert cli.main(["check"]) == 130
    assert capsys.readouterr().err.strip() == "attnlab check: interrupted"


def _parser_with(func):
    import argparse

    parser = argparse.ArgumentParser(prog="attnlab")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check").set_defaults(func=func)
    return parser


def test_a_fractional_top_n_is_refused():
    import torch

    from attnlab.normalization.metrics import distance

    probs = torch.softmax(torch.randn(1, 6, 6), -1)
    with pytest.raises(ValueError, match="whole number"):
        distance.dtilde(probs, torch.randn(1, 6, 3), 2.7)
    assert distance.dtilde(probs, torch.randn(1, 6, 3), 2.0).shape == (1, 6)


def test_figures_are_written_whole_with_a_manifest_of_the_run(tmp_path, monkeypatch):
    import json

    from attnlab import figures

    r = _result()
    r.name = "fig2a"
    from dataclasses import replace

    monkeypatch.setitem(figures.FIGURES, "fig2a", replace(figures.FIGURES["fig2a"], plot=_tiny_plot))
    manifest = json.loads(figures.write_figures(tmp_path, {"fig2a": r}).read_text())
    assert sorted(manifest["files"]) == ["fig2a.csv", "fig2a.json", "fig2a.png"] and manifest["model"] == "m"
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".part"]
    assert figures.verify_manifest(tmp_path) == []


def test_the_manifest_vouches_only_for_the_bytes_its_run_wrote(tmp_path, monkeypatch):
    """Another run replaces fig2a.csv after this one wrote it: the manifest holds the sha256 of what
    this run wrote, so the mixed folder fails verification (it used to hash the files found on disk)."""
    import json

    from attnlab import figures

    r = _result()
    r.name = "fig2a"
    from dataclasses import replace

    def another_run_writes(fig_id, paths):     # between this run's files and its manifest
        (tmp_path / "fig2a.csv").write_bytes(b"L,value\n1,2\n")

    monkeypatch.setitem(figures.FIGURES, "fig2a", replace(figures.FIGURES["fig2a"], plot=_tiny_plot))
    figures.write_figures(tmp_path, {"fig2a": r}, report=another_run_writes)
    assert json.loads((tmp_path / "manifest.json").read_text())["files"]["fig2a.csv"] != \
        __import__("hashlib").sha256(b"L,value\n1,2\n").hexdigest()
    assert figures.verify_manifest(tmp_path) == ["fig2a.csv: not the bytes this run wrote (another run replaced it)"]


def test_two_runs_on_one_folder_take_turns(tmp_path):
    """folder_lock: while one run writes --out, a second waits; it enters only after the first is done."""
    order = []
    inside = threading.Event()

    def second():
        inside.wait(10)
        with util.folder_lock(tmp_path):
            order.append("second")

    t = threading.Thread(target=second)
    t.start()
    with util.folder_lock(tmp_path):
        inside.set()
        t.join(0.5)
        assert t.is_alive(), "the second run entered while the first held the folder"
        order.append("first")
    t.join(10)
    assert order == ["first", "second"]


def _tiny_plot(result):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1, 1))
    fig.subplots().plot([0, 1])
    return fig


def test_non_finite_inputs_are_errors_that_name_the_tensor_and_position():
    """+inf is not a mask, NaN is not a skipped row, a mask in one head is not a mask in every head."""
    import math

    import torch

    from attnlab.normalization.metrics import distance, gradients, rows
    from attnlab.tools import normalizers

    with pytest.raises(ValueError, match=r"position \(1,\).*-inf"):
        normalizers.softmax(torch.tensor([0.0, math.inf, 1.0]))
    for name in normalizers.NORMALIZERS:
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            normalizers.get_normalizer(name)(torch.tensor([[0.0, math.inf, 1.0]]))
    masked = normalizers.softmax(torch.tensor([0.0, -math.inf, 1.0]))      # -inf is the mask
    assert float(masked[1]) == 0.0 and torch.allclose(masked.sum(), torch.tensor(1.0))
    for T in (math.nan, math.inf, 0.0):
        with pytest.raises(ValueError, match="temperature"):
            normalizers.softmax(torch.zeros(3), T=T)
        with pytest.raises(ValueError, match="temperatures"):
            gradients.fd_grad_norms(torch.zeros(1, 2, 2), [T], [1e-3])
        with pytest.raises(ValueError, match="temperature"):
            rows.log_weights(torch.zeros(1, 2, 2), T)

    probs = torch.softmax(torch.randn(2, 5, 5), -1)
    x = torch.randn(2, 5, 3)
    bad = probs.clone()
    bad[1, 2, 3] = math.inf
    with pytest.raises(ValueError, match=r"probs has an infinity at position \(1, 2, 3\)"):
        distance.distance_stats(bad, x, [1])
    bad_x = x.clone()
    bad_x[0, 4, 1] = math.nan
    with pytest.raises(ValueError, match=r"x has NaN at position \(0, 4, 1\)"):
        distance.distance_stats(probs, bad_x, [1])

    scores = torch.randn(2, 4, 4)
    scores[0, 3, 1] = -math.inf                                            # masked in head 0 only
    with pytest.raises(ValueError, match="per-head masks"):
        gradients.fd_grad_norms(scores, [1.0], [1e-3])
    scores[1, 3, 1] = -math.inf                                            # now in every head: a mask
    assert bool(torch.isnan(gradients.fd_grad_norms(scores, [1.0], [1e-3])).logical_not().any())


@pytest.mark.parametrize("name, keep", [("merges.txt", 20_000), ("vocab.json", 1000)])
def test_a_shortened_tokenizer_file_is_refused_by_name(tmp_path, name, keep):
    """A merges.txt cut to 20,000 lines keeps 'Hello world' right but changes every window; a cut
    vocab.json would fail deep inside the BPE library: both are refused, naming the file."""
    import shutil

    from attnlab.core import models, text

    src = text.data_dir() / "gpt2-tokenizer"
    shutil.copytree(src, tmp_path / "tok")
    path = tmp_path / "tok" / name
    data = path.read_bytes()
    path.write_bytes(b"\n".join(data.split(b"\n")[:keep]) if name == "merges.txt" else data[:keep])
    with pytest.raises(models.ModelUnavailable, match=f"{name} is not OpenAI's GPT-2 {name}"):
        models.gpt2_tokenizer_from_files(tmp_path / "tok")
    assert len(models.gpt2_tokenizer_from_files(src)) == models.GPT2_VOCAB_SIZE     # the real files pass


def test_bad_model_and_text_inputs_say_what_is_wrong(tmp_path, tiny):
    import os
    import time

    import torch

    from attnlab.core.models import load_model
    from attnlab.core.text import read_text_file
    from attnlab.tools import report

    with pytest.raises(ValueError, match="does not exist"):
        load_model(str(tmp_path / "no-such-model"))
    vocab = tiny.hf.config.vocab_size
    ids = torch.tensor([1, 2, 3, vocab + 5, 4])
    with pytest.raises(ValueError, match=f"token id {vocab + 5} at position 3 is outside"):
        tiny.capture(ids)
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="NUL bytes"):
        read_text_file(nul)
    # a report folder left half-written by a killed run is cleaned up by the next one
    stale = tmp_path / ".report.tmp-dead"
    stale.mkdir()
    old = time.time() - 3600
    os.utime(stale, (old, old))
    r = _result()
    r.name = "diagnose"
    r.rows = []
    monkey = report.report_html
    try:
        report.report_html = lambda result: "<html></html>"
        report.write_report(r, tmp_path / "report")
    finally:
        report.report_html = monkey
    assert not stale.exists() and (tmp_path / "report" / "diagnose.html").is_file()


def test_bench_capture_honours_the_model(monkeypatch):
    from attnlab import benchmarks
    from attnlab.cli import bench

    seen = []
    monkeypatch.setattr(benchmarks, "bench_capture", lambda names, repeats: seen.append(names) or [])

    class Args:
        model, quick = "tiny-gpt2", True

    bench.bench_capture(Args())
    Args.model = None
    bench.bench_capture(Args())
    assert seen == [("tiny-gpt2",), ("minilm", "tiny-gpt2")]


@pytest.fixture
def saved_tiny(tmp_path, tiny):
    """A tiny GPT-2 saved as config.json + model.safetensors in a folder (the tokenizer comes from the data)."""
    folder = tmp_path / "tiny"
    tiny.hf.save_pretrained(folder, safe_serialization=True)
    return folder


def test_damaged_weights_give_one_line_by_cause(saved_tiny):
    import json

    from safetensors.torch import load_file, save_file

    from attnlab.core.models import ModelUnavailable, load_model

    assert load_model(str(saved_tiny)).n_layers >= 1                      # intact: loads
    weights = saved_tiny / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 3])
    with pytest.raises(ModelUnavailable, match="truncated or corrupt") as caught:
        load_model(str(saved_tiny))
    assert "\n" not in str(caught.value)
    weights.write_bytes(good)
    tensors = load_file(weights)
    name = next(iter(tensors))
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ModelUnavailable, match="NaN or inf"):
        load_model(str(saved_tiny))
    weights.write_bytes(good)
    config = json.loads((saved_tiny / "config.json").read_text())
    config["n_embd"] = config["n_embd"] * 2
    (saved_tiny / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelUnavailable) as caught:
        load_model(str(saved_tiny))
    assert "\n" not in str(caught.value) and "config.json" in str(caught.value)


def test_the_hub_probe_speaks_https(monkeypatch):
    """A proxy that accepts TCP but fails TLS is 'unreachable'; any HTTP answer is 'reachable'."""
    import ssl
    import urllib.error
    import urllib.request

    from attnlab.core import models

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")

    def tls_fails(*a, **k):
        raise urllib.error.URLError(ssl.SSLError("handshake failed"))

    def answers_404(*a, **k):
        raise urllib.error.HTTPError("https://huggingface.co", 404, "Not Found", {}, None)

    monkeypatch.setattr(urllib.request, "urlopen", tls_fails)
    assert models.hub_reachable() is False
    monkeypatch.setattr(urllib.request, "urlopen", answers_404)
    assert models.hub_reachable() is True


def test_a_data_dir_that_does_not_exist_is_named(monkeypatch, tmp_path):
    from attnlab.core.text import load_corpus

    monkeypatch.setenv("ATTNLAB_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        load_corpus("war_and_peace")


def test_forward_checks_every_row_of_a_batch(tiny):
    import torch

    vocab = tiny.hf.config.vocab_size
    batch = torch.tensor([[1, 2, 3], [4, vocab, 6]])
    with pytest.raises(ValueError, match=f"token id {vocab} at position 1 is outside"):
        tiny.forward(batch)
    assert tiny.forward(batch.clamp(max=vocab - 1)) is not None


def test_bad_bench_options_fail_at_once_with_one_line(capsys, no_model_loads):
    """Unknown figure ids, a bad --max-length or --threads, figures-only options elsewhere: exit 2, one line,
    before any model is loaded."""
    from attnlab.cli import main

    for argv, says in ((["--figures", "fig9"], "unknown figure id(s) fig9"),
                       (["--figures", "fig1", "tsc_real"], "the paper's figures only"),
                       (["--max-length", "1"], "argument --max-length: must be an integer >= 2, got '1'"),
                       (["--max-length", "1.5"], "argument --max-length: must be an integer >= 2, got '1.5'"),
                       (["--threads", "0"], "--threads must be an integer >= 1")):
        try:
            code = main(["bench", "figures", "--model", "gpt2-random", *argv])
        except SystemExit as exc:                   # argparse's own errors (--max-length's `type=`)
            code = exc.code
        assert code == 2
        out, err = capsys.readouterr()
        assert not out and err.count("\n") == 1 and says in err, err
    assert main(["bench", "capture", "--no-oracle"]) == 2
    assert "bench figures` only" in capsys.readouterr().err


def test_bench_figures_passes_its_options_down_and_ends_with_its_summary(monkeypatch, capsys):
    from attnlab import benchmarks, figures
    from attnlab.cli import main

    seen = []

    def fake(model, ids, **kw):
        seen.append(kw)
        rows = [{"figure": f, "vectorised_full_s": 1.5} for f in kw["figures"]]
        return rows if not kw["with_oracle"] else [dict(r, speedup=60.0) for r in rows]

    class Inputs:
        def __init__(self, name, device):
            self.model = type("M", (), {"name": name})()

        def ids(self):
            return None

    monkeypatch.setattr(benchmarks, "bench_figures", fake)
    monkeypatch.setattr(figures, "Inputs", Inputs)
    assert main(["bench", "figures", "--model", "m", "--figures", "fig2a", "fig1", "--max-length", "64",
                 "--no-oracle", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert seen[-1]["figures"] == ["fig2a", "fig1"] and seen[-1]["max_length"] == 64
    assert seen[-1]["with_oracle"] is False
    assert lines[0].startswith("torch threads: 1 (chosen)")
    assert lines[-2].startswith("peak memory: ") and lines[-2].endswith(" GB") and lines[-1].startswith("total: 3.0 s")
    assert main(["bench", "figures", "--model", "m", "--quick"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert seen[-1]["max_length"] is None and seen[-1]["with_oracle"] is True and len(seen[-1]["figures"]) == 6
    assert lines[-2].startswith("peak memory: ") and lines[-1] == "min speedup: 60.0"


def test_bench_figures_max_length_and_no_oracle(tiny):
    import torch

    from attnlab import benchmarks

    ids = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(0))
    rows = benchmarks.bench_figures(tiny, ids, quick=True, figures=["fig1"], max_length=40, with_oracle=False,
                                    threads=1)
    assert [r["figure"] for r in rows] == ["fig1"] and rows[0]["L_max"] == 40 and rows[0]["n_lengths"] == 2
    assert rows[0]["vectorised_full_s"] > 0 and "speedup" not in rows[0] and "oracle_s" not in rows[0]
    for bad in (1, 2.5, True):
        with pytest.raises(ValueError, match="max_length"):
            benchmarks.bench_figures(tiny, ids, figures=["fig1"], max_length=bad)


def test_free_cpus_reads_since_its_last_call_without_sleeping_and_its_own_work_is_not_a_neighbours(monkeypatch):
    """Between a run's figures `free_cpus` measures the machine since its last call (no 0.1 s sleep each time):
    2 CPUs never idle while this process kept 1.9 busy is 2 free; while it kept 1 busy (a neighbour the other) is 1.
    The first call, and one after more than CPU_READ_MAX_AGE seconds, sleep `interval` as before."""
    slept = []
    monkeypatch.setattr(util.time, "sleep", slept.append)
    monkeypatch.setattr(util, "allowed_cpus", lambda: 2)
    monkeypatch.setattr(util.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(util, "_LAST_CPU_READ", [])
    reads = iter([(0, 0, 0.0, 0.0), (20, 20, 0.0, 0.1),             # first call: sleeps, a quiet machine
                  (20, 1020, 9.5, 5.1),                               # 5 s later: itself 1.9 CPUs, none idle
                  (20, 2020, 14.5, 10.1),                             # 5 s later: itself 1 CPU, none idle
                  (20, 22020, 14.5, 110.1), (20, 22040, 14.5, 110.2)])  # 100 s later: too old, sleeps again
    monkeypatch.setattr(util, "_cpu_read", lambda: next(reads))
    assert util.free_cpus(0.1) == 2 and slept == [0.1]
    assert util.free_cpus(0.1) == 2 and slept == [0.1]
    assert util.free_cpus(0.1) == 1 and slept == [0.1]
    assert util.free_cpus(0.1) == 1 and slept == [0.1, 0.1]


def test_a_busy_machine_lowers_auto_threads_but_never_a_chosen_count(monkeypatch):
    import torch

    assert 1 <= util.free_cpus(0.02) <= util.allowed_cpus()
    assert util.peak_memory_bytes() > 10 << 20
    n = torch.get_num_threads()
    if n < 2 or util.threads_chosen():
        pytest.skip("needs torch's default count of >= 2 threads, not chosen by the user")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(util, "free_cpus", lambda interval=0.1: 1)      # another process holds the others

    @util.with_threads
    def work(threads=None):
        return torch.get_num_threads()

    with util.auto_threads():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == n and work() == 1 and work(threads=2) == 2
    with util.threads(1):                      # numba's pool starts (at the latest here): torch keeps the count
        numba = pytest.importorskip("numba")
        numba.get_num_threads()
        assert torch.get_num_threads() == 1
    with util.threads(2):                      # chosen by the caller: kept, nested calls included
        assert work() == 2
        with util.auto_threads():
            assert torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", str(n))
    assert work() == n
    monkeypatch.setattr(util, "free_cpus", lambda interval=0.1: 64)     # never raised above torch's count
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert work() == n and torch.get_num_threads() == n
