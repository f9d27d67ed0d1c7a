"""The run's workspace (`attnlab.workspace.Workspace`, `figures.Inputs`): loaded once, and siblings on other windows
share what is loaded, through public methods (no reach-ins)."""
import pytest

from attnlab import figures
from attnlab.workspace import Workspace


def test_inputs_is_the_workspace():
    assert figures.Inputs is Workspace


def test_around_holds_a_loaded_model_and_siblings_share_it(tiny):
    ws = Workspace.around(tiny, max_length=64)
    assert ws.model is tiny and ws.model_name == tiny.name and ws.device == "cpu" and ws.threads is None
    assert ws.window_length == 64 and len(ws.ids()) == 64
    corpus = ws.corpus
    same = ws.with_window(max_length=None)                  # None: the paper's 1024, cut at the model's positions
    assert same.model is tiny and same.corpus is corpus and same.max_length is None
    assert same.window_length == min(tiny.max_positions, 1024)
    later = ws.with_window(start=1000)
    assert later.model is tiny and later.corpus is corpus and (later.start, later.max_length) == (1000, 64)
    assert later.ids().tolist() == tiny.window(corpus.text[1000:], 64).tolist()
    other = ws.with_window(text="wikitext2", start=5)
    assert other.model is tiny and other.text_name == "wikitext2" and other.window_key()["text_name"] == "wikitext2"
    assert ws.start == 0 and ws.text_name == "war_and_peace"             # the workspace itself is unchanged


def test_siblings_keep_the_checks_and_the_thread_count(tiny):
    ws = Workspace.around(tiny, max_length=64, threads=1)
    assert ws.with_window(start=3).threads == 1
    import torch

    before = torch.get_num_threads()
    with ws.thread_count():                                  # `figures.compute_figures` runs under it
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="--max-length"):
        ws.with_window(max_length=8)
    with pytest.raises(ValueError, match="--threads"):
        Workspace("tiny-gpt2", "cpu", threads=0)


def test_shared_models_load_once_per_name_only_once_turned_on(monkeypatch):
    """`share_models` (the book's chapters): every workspace of the process gets the one model, by the name asked or
    the model's own; off (the default) each workspace loads its own."""
    from attnlab import workspace
    from attnlab.core import models

    loads = []
    real = models.load_model
    monkeypatch.setattr(models, "load_model", lambda name, device="cpu": loads.append(name) or real(name, device))
    monkeypatch.setattr(workspace, "_SHARED", None)
    a, b = Workspace("tiny-gpt2", "cpu").model, Workspace("tiny-gpt2", "cpu").model
    assert a is not b and loads == ["tiny-gpt2", "tiny-gpt2"]
    workspace.share_models()
    c = Workspace("tiny-gpt2", "cpu").model
    assert Workspace("tiny-gpt2", "cpu", max_length=64).model is c and loads == ["tiny-gpt2"] * 3
    workspace.share_models()                                 # a second call keeps what is loaded
    assert Workspace("tiny-gpt2", "cpu").with_window(start=5).model is c and len(loads) == 3
