"""The Colab-style test (a fresh venv, a wheel, chapter 1): minutes, so not part of `pytest tests`.
Collected only when named explicitly (`pytest tests/colab`, which `make colab` does)."""
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pytest_ignore_collect(collection_path, config):
    named = any(HERE == Path(str(a).split("::")[0]).resolve() or HERE in Path(str(a).split("::")[0]).resolve().parents
                for a in config.args)
    return None if named else (collection_path.name.startswith("test_") or None)
