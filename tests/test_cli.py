"""Issue #51, a researcher's first ten minutes: a light and fast --help, --version, --quiet everywhere, one-line
warnings and errors, exit 2 for a model folder that cannot serve, and `attnlab capture`."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.core import settings

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "numba", "scipy", "transformers", "matplotlib")


def _cli(*argv, env=None):
    """`python -m attnlab.cli argv` in a subprocess, stdout and stderr pipes (not a TTY): (code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "attnlab.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def tiny_llama_folder(folder: Path, vocab: int = 50257, tokenizer: bool = True) -> Path:
    """A seeded random Llama (2 layers x 4 heads sharing 2 key/value heads) saved with GPT-2's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from attnlab.core import models

    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=0, eos_token_id=min(1, vocab - 1), pad_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(folder)
    if tokenizer:
        models.gpt2_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return tiny_llama_folder(tmp_path_factory.mktemp("llama") / "model")


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("The cat sat on the mat. It was a sunny day, and the birds sang in the old oak tree.\n")
    return path


# ------------------------------------------------------------------------------------------ A: conventions

def test_building_the_parser_imports_no_heavy_library():
    code = ("import sys, attnlab.cli; attnlab.cli.build_parser(); "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_and_version():
    """--help and --version (fast because building the parser imports no heavy library: the test above; the time is
    measured in BENCHMARKS.md, not asserted here)."""
    code, out, _ = _cli("--help")
    assert code == 0 and "capture" in out and "--version" in out
    code, out, _ = _cli("--version")
    from attnlab import __version__
    assert code == 0 and out.strip() == f"attnlab {__version__}"


@pytest.mark.parametrize("command", ["info", "figures", "check", "capture", "diagnose", "bench", "verify-results",
                                     "results list", "results verify", "results compute"])
def test_every_command_has_help_and_quiet(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*command.split(), "--help"])
    assert stop.value.code == 0
    assert "--quiet" in capsys.readouterr().out


def test_light_copies_agree_with_the_library():
    import ast

    from attnlab import figures
    from attnlab.cli import diagnose as cli_diagnose
    from attnlab.cli import figures as cli_figures
    from attnlab.tools import diagnose

    assert cli_figures.FIGURE_IDS == tuple(figures.FIGURES) and cli_figures.PAPERS == figures.PAPERS
    doc = ast.get_docstring(ast.parse(Path(diagnose.__file__).read_text()))
    assert cli_diagnose.DESCRIPTION == doc.split("\n\n")[0]


def test_warnings_print_as_one_line(capsys):
    from attnlab.cli import one_line_warnings
    from attnlab.core.model_files import AttnlabWarning

    show = one_line_warnings()
    show(AttnlabWarning("two\n  lines"), AttnlabWarning, "/elsewhere/x.py", 1)
    show(UserWarning("attnlab: from the package"), UserWarning, str(ROOT / "attnlab" / "core" / "models.py"), 3)
    show(FutureWarning("a library's"), FutureWarning, "/site-packages/transformers/foo.py", 9)
    err = capsys.readouterr().err.splitlines()
    assert err == ["attnlab: warning: two lines", "attnlab: warning: from the package",
                   "attnlab: warning: (FutureWarning from foo) a library's"]


def test_quiet_keeps_only_errors_and_warnings():
    import io

    from attnlab.cli.options import QuietStderr

    sink = io.StringIO()
    quiet = QuietStderr(sink)
    quiet.write("attnlab: computed fig1 (minilm) in 1.0 s\n[check] 13 Results\nfig1:  50%|#####\r")
    quiet.write("attnlab: warning: x\nattnlab check: error: y\n")
    assert not quiet.isatty() and sink.getvalue() == "attnlab: warning: x\nattnlab check: error: y\n"


def test_numba_cache_cold_is_said_once(tmp_path):
    from attnlab.normalization.kernels import metrics

    assert metrics.cache_is_cold(tmp_path)
    here = os.path.dirname(os.path.abspath(metrics.__file__))
    import hashlib

    sub = tmp_path / f"kernels_{hashlib.sha1(here.encode()).hexdigest()}"
    sub.mkdir()
    (sub / "metrics.f-1.py311.nbi").write_bytes(b"")
    assert not metrics.cache_is_cold(tmp_path)


# ------------------------------------------------------------------------------------------ B: one line, exit 2

def test_a_folder_without_tokenizer_files_is_one_line_and_a_value_error(tmp_path):
    from attnlab.core.models import load_model

    folder = tiny_llama_folder(tmp_path / "notok", tokenizer=False)
    with pytest.raises(ValueError, match=r"model folder .*notok has no tokenizer files .*tokenizer\.json"):
        load_model(str(folder))
    code, out, err = _cli("info", "--model", str(folder))
    lines = [line for line in err.splitlines() if line.startswith("attnlab")]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("attnlab info: error: model folder") and "model.safetensors" in lines[0]


def test_a_vocabulary_below_three_is_exit_2(tmp_path):
    from attnlab.core.models import load_model

    folder = tiny_llama_folder(tmp_path / "v2", vocab=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="a vocabulary of 2 token"):
            load_model(str(folder))
        assert main(["info", "--model", str(folder)]) == 2


# ------------------------------------------------------------------------------------------ D: capture

def test_capture_saves_what_the_model_captures(llama_folder, text_file, tmp_path):
    from safetensors.torch import load_file

    from attnlab.cli.capture import text_ids
    from attnlab.core.models import load_model

    out = tmp_path / "cap"
    assert main(["capture", "--model", str(llama_folder), "--text", str(text_file), "--out", str(out),
                 "--layers", "1", "--qkv", "--quiet"]) == 0
    saved = load_file(str(out / "attention.safetensors"))
    info = json.loads((out / "capture.json").read_text())
    model = load_model(str(llama_folder))
    ids = text_ids(model, text_file.read_text(), 512)
    trace = model.capture(ids, layers=[1], keep=("probs", "q", "k", "v"))
    assert torch.equal(saved["probs"], trace.probs) and torch.equal(saved["q"], trace.q)
    assert torch.equal(saved["token_ids"], ids)
    assert torch.allclose(saved["probs"].sum(-1), torch.ones(1, 4, len(ids)), atol=1e-5)
    assert info["model_identity"] == model.identity and info["layers"] == [1] and info["tokens"] == len(ids)
    assert info["text_sha256"] and info["token_ids"] == ids.tolist() and len(info["token_strings"]) == len(ids)


def test_capture_of_a_missing_text_is_one_line(llama_folder, tmp_path, capsys):
    assert main(["capture", "--model", str(llama_folder), "--text", str(tmp_path / "nope.txt"),
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnlab capture: error: text file") and "does not exist" in err[0]
    assert not (tmp_path / "o").exists()


def test_no_carriage_return_or_cursor_codes_in_a_pipe(tmp_path):
    code, out, err = _cli("figures", "fig1", "fig2c", "--quick", "--model", "tiny-gpt2", "--out", str(tmp_path / "o"))
    assert code == 0, err                              # `figures` computes (no results cache): fig2c's N-scan bar too
    assert "\r" not in err + out and "\x1b[" not in err + out
    code, out, err = _cli("figures", "fig1", "--quick", "--model", "tiny-gpt2", "--out", str(tmp_path / "o"),
                          "--quiet")
    assert code == 0 and err == "", err


# ------------------------------------------------------------------------------------------ C: check

def test_check_prints_a_summary_and_json_keeps_every_row(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    argv = ["check", "--model", "tiny-gpt2", "--quick", "--paper", "normalization", "--readings", "default"]
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert 3 <= len(out) <= 30 and "--all" in out[-1] and "not applicable" in out[-1]
    assert all("not applicable" not in line for line in out[:-1])
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(not r["reading"] for r in rows)
    for r in rows:
        assert {"value", "unit", "model", "reading", "verdict", "provenance"} <= set(r)
        assert r["model"] == "tiny-gpt2" and r["provenance"]["text_sha256"]
    assert main([*argv, "--all"]) == 0
    assert len(capsys.readouterr().out.splitlines()) > len(out)


def test_check_says_up_front_when_paper_2_has_no_encoder(monkeypatch, capsys):
    from attnlab.core import models

    real = models.load_model

    def no_minilm(name, device="cpu"):
        if name == "minilm":
            raise models.ModelUnavailable("minilm is not installed")
        return real(name, device)

    monkeypatch.setattr(models, "load_model", no_minilm)
    computed = []
    from attnlab import figures

    monkeypatch.setattr(figures, "cached_figures", lambda *a, **k: computed.append(a) or {})
    assert main(["check", "--model", "tiny-gpt2", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs an encoder" in err[0] and "--paper normalization" in err[0] and not computed


# ------------------------------------------------------------------------------------------ F: the README's path

README = ROOT / "README.md"
MARK = "<!-- readme-capture-example"


def readme_example() -> str:
    """The README's Python capture example: the ```python block right after its marker."""
    text = README.read_text()
    block = text[text.index(MARK):]
    start = block.index("```python\n") + len("```python\n")
    return block[start:block.index("```", start)]


def test_the_readme_puts_the_researchers_path_first():
    text = README.read_text()
    first = text.index("## A researcher's first ten minutes")
    assert first < text.index("make book") and first < text.index("make test")
    assert "pip install -c constraints.txt" in text and "attnlab check --model" in text
    assert "attnlab capture" in text and len(readme_example().strip().splitlines()) == 4


def test_the_readme_capture_example_runs():
    from attnlab.core.models import ModelUnavailable

    scope: dict = {}
    try:
        exec(compile(readme_example(), "README.md", "exec"), scope)
    except ModelUnavailable as exc:
        pytest.skip(f"MiniLM is not installed here: {exc}")
    probs = scope["trace"].probs
    assert probs.ndim == 4 and torch.allclose(probs.sum(-1), torch.ones(probs.shape[:-1]), atol=1e-5)
    assert scope["trace"].q is not None


@pytest.mark.skipif(not settings.get("ATTNLAB_FRESH_VENV_TEST"),
                    reason="opt-in (ATTNLAB_FRESH_VENV_TEST=1): a fresh venv and a pip install take minutes")
def test_the_readme_path_works_in_a_fresh_venv(tmp_path):
    """A venv without system site packages, the README's install lines (the package with the constraints file, the
    offline model wheels), then its capture example and `attnlab --help` with that venv's Python."""
    import venv

    from attnlab.core import model_table

    venv.create(tmp_path / "venv", with_pip=True, system_site_packages=False)
    py = str(tmp_path / "venv" / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-c", str(ROOT / "constraints.txt"), str(ROOT)], check=True, timeout=3000)
    subprocess.run([*pip, "--no-deps", *model_table.requirements()], check=True, timeout=600)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = readme_example() + "\nassert abs(float(trace.probs.sum(-1).mean()) - 1) < 1e-5\nprint('ok')\n"
    run = subprocess.run([py, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr
    run = subprocess.run([str(tmp_path / "venv" / "bin" / "attnlab"), "--help"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert run.returncode == 0 and "capture" in run.stdout
