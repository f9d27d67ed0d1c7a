"""Corpora through the project's loaders."""
import pytest

from attnlab.core import text, util


def test_war_and_peace_clean(war_and_peace):
    assert war_and_peace.verified
    assert war_and_peace.sha256 == text.CORPORA["war_and_peace"].sha256
    assert war_and_peace.text.startswith("BOOK ONE: 1805")
    assert "\r" not in war_and_peace.text
    assert "Gutenberg" not in war_and_peace.text[:5000] and "PROJECT GUTENBERG" not in war_and_peace.text[-5000:]
    assert war_and_peace.provenance()["text_sha256"] == war_and_peace.sha256


def test_wikitext():
    w = text.load_corpus("wikitext2", allow_download=False)
    assert w.verified and "Robert Boulter" in w.text[:200]


def test_corrupt_data_dir_file_is_refused(tmp_path, monkeypatch):
    (tmp_path / "war_and_peace.txt").write_text("not the novel")
    monkeypatch.setenv("ATTNLAB_DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="sha256"):
        text.load_corpus("war_and_peace")


def test_missing_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="not found"):
        text.load_corpus("war_and_peace", allow_download=False)
    with pytest.raises(ValueError, match="unknown corpus"):
        text.load_corpus("nope")


def test_windows(tiny, minilm, war_and_peace):
    ids = tiny.window(war_and_peace.text, 50, offset=10)
    whole = tiny.tokenizer(war_and_peace.text[:2000])["input_ids"]
    assert ids.tolist() == whole[10:60]
    enc = minilm.window(war_and_peace.text, 40)
    assert enc[0] == minilm.tokenizer.cls_token_id and enc[-1] == minilm.tokenizer.sep_token_id and len(enc) == 40
    with pytest.raises(ValueError, match="exceeds"):
        minilm.window(war_and_peace.text, 513)
    with pytest.raises(ValueError, match="empty"):
        tiny.window("   ", 10)
    with pytest.raises(ValueError, match="do not fit"):
        tiny.window("a short text", 100)


def test_atomic_write(tmp_path):
    target = tmp_path / "x" / "f.txt"
    util.atomic_write(target, b"abc")
    assert target.read_bytes() == b"abc" and list(target.parent.iterdir()) == [target]
