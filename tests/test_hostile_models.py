"""A model directory's code never runs: a planted `auto_map` is refused by every loader, non-interactively,
even when a "y" waits on stdin; the refusal is one line and the directory's Python file never executes."""
import io
import json
import subprocess
import sys

import pytest

from attnlab.core import models

EVIL = """import pathlib
pathlib.Path({marker!r}).write_text("the directory's code ran")
from transformers import PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def tiny_llama(n_kv: int = 2, seed: int = 0, vocab: int = models.GPT2_VOCAB_SIZE):
    """A seeded random Llama: 2 layers, 4 query heads sharing `n_kv` key/value heads, RoPE, eager attention."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=n_kv, max_position_embeddings=256,
                         rope_theta=10000.0, attn_implementation="eager")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


@pytest.fixture
def planted(tmp_path):
    """(directory, marker): a loadable Llama directory whose tokenizer_config.json names code of its own
    (auto_map, no tokenizer_class: transformers would ask on stdin) and whose code writes `marker`."""
    directory, marker = tmp_path / "model", tmp_path / "marker"
    tiny_llama().save_pretrained(directory)
    models.gpt2_tokenizer().save_pretrained(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("tokenizer_class", None)
    config["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "evil.py").write_text(EVIL.format(marker=str(marker)))
    return directory, marker


def test_a_planted_auto_map_is_refused_before_anything_is_read(planted):
    directory, marker = planted
    with pytest.raises(models.ModelUnavailable, match="auto_map.*never runs"):
        models.load_model(str(directory))
    assert not marker.exists()


def test_without_the_directory_check_no_loader_runs_the_code(planted, monkeypatch):
    """The second guard: every from_pretrained gets trust_remote_code=False, so transformers asks nothing on
    stdin (without it, the "y" waiting there would run the code)."""
    directory, marker = planted
    monkeypatch.setattr(models, "refuse_code", lambda directory: None)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\ny\n"))
    try:
        models.load_model(str(directory))
    except (models.ModelUnavailable, ValueError):
        pass
    assert not marker.exists()


def test_the_cli_refuses_with_one_line_even_when_yes_is_piped(planted):
    directory, marker = planted
    run = subprocess.run([sys.executable, "-m", "attnlab.cli", "figures", "fig1", "--quick", "--model", str(directory),
                          "--out", str(directory.parent / "out")], input="y\ny\n", capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    lines = [l for l in run.stderr.splitlines() if l.strip()]
    assert lines[-1].startswith("attnlab figures: error:") and "auto_map" in lines[-1]
    assert "Traceback" not in run.stderr
    assert not marker.exists()


def _special(path, kind: str) -> None:
    """Make `path` a FIFO ("fifo") or a symlink to /dev/zero ("zero")."""
    import os

    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def _returns_within(fn, seconds: float = 30):
    """The exception `fn()` raises, or None; fails when it runs past `seconds` (a blocked open, an endless read)."""
    import threading

    seen = []

    def run():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            seen.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    return seen[0] if seen else None


@pytest.mark.parametrize("name, kind", [("extra.json", "fifo"), ("extra.json", "zero"), ("config.json", "fifo"),
                                        ("model.safetensors", "zero"), ("model.gguf", "zero")])
def test_a_model_folder_holding_a_file_that_is_not_regular_is_refused_in_one_line(tmp_path, name, kind):
    """Was: a FIFO extra.json blocked refuse_code's read forever, a link to /dev/zero ended in a MemoryError, a
    model.gguf link to /dev/zero made file_sha256 read without end; a FIFO config.json hung transformers."""
    folder = tmp_path / "model"
    folder.mkdir()
    _special(folder / name, kind)
    exc = _returns_within(lambda: models.load_model(str(folder)))
    assert isinstance(exc, models.ModelUnavailable), repr(exc)
    assert name in str(exc) and "not a regular file" in str(exc) and "\n" not in str(exc)


def test_a_gguf_path_that_is_a_link_to_a_device_is_refused(tmp_path):
    link = tmp_path / "weights.gguf"
    _special(link, "zero")
    exc = _returns_within(lambda: models.load_model(str(link)))
    assert isinstance(exc, models.ModelUnavailable) and "not a regular file" in str(exc), repr(exc)


def test_the_cli_refuses_a_fifo_in_a_model_folder_with_one_line(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    _special(folder / "extra.json", "fifo")
    run = subprocess.run([sys.executable, "-m", "attnlab.cli", "figures", "fig1", "--quick", "--model", str(folder),
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    lines = [l for l in run.stderr.splitlines() if l.strip()]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert lines[-1].startswith("attnlab figures: error:") and "extra.json" in lines[-1]
    assert "not a regular" in lines[-1]


@pytest.mark.parametrize("metadata, says", [
    ({"attention.head_count": 0}, "llama.attention.head_count is 0 in the GGUF metadata"),  # was: ZeroDivisionError
    ({"attention.head_count_kv": 0}, "llama.attention.head_count_kv is 0"),                 # was: ZeroDivisionError
    ({"block_count": None}, "lacks llama.block_count"),          # was: loaded as 32 layers, 30 of them random
    ({"rope.dimension_count": 0}, "llama.rope.dimension_count is 0"),                      # was: ZeroDivisionError
    ({"rope.freq_base": float("nan")}, "llama.rope.freq_base is nan in the GGUF metadata: the file is corrupt"),
    ({"attention.head_count": 8, "attention.head_count_kv": 8, "embedding_length": 36},
     "The hidden size (36) is not a multiple of the number of attention heads (8)"),       # was: cut off at ':'
    (None, "NaN or inf (tensor model.layers.1.self_attn.k_proj.weight)"),                 # was: loaded, NaN scores
])
def test_a_broken_gguf_is_refused_in_one_complete_line_naming_the_field(tmp_path, monkeypatch, metadata, says):
    import torch
    from gguf_writer import TINY_VOCAB_SIZE, write_tiny_gguf

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    llama = tiny_llama(vocab=TINY_VOCAB_SIZE)
    if metadata is None:
        with torch.no_grad():
            llama.model.layers[1].self_attn.k_proj.weight[0, 3] = float("nan")
    path = write_tiny_gguf(tmp_path / "broken.gguf", llama, metadata=metadata)
    with pytest.raises(models.ModelUnavailable) as caught:
        models.load_model(str(path))
    assert str(path) in str(caught.value) and says in str(caught.value) and "\n" not in str(caught.value)
