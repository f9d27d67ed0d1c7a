"""The results store (`core.store`): a folder, a file:// URL or an fsspec URL (memory:// here) hold the same Results
under the same keys; a write killed half-way leaves nothing a reader takes for a Result."""
from __future__ import annotations

import warnings

import pytest

from attnlab.core import cache
from attnlab.core.result import Result
from attnlab.core.store import Store

KEY = {"figure": "demo", "model": "m"}
DEMO = Result("demo", [{"L": 1, "value": 0.5}, {"L": 2, "value": 0.25}], {"model": "m"})


@pytest.fixture
def memory_store(monkeypatch):
    """ATTNLAB_RESULTS_DIR = a fresh memory:// URL (fsspec's in-process file system), emptied after the test."""
    import uuid

    import fsspec

    url = f"memory://attnlab-test-{uuid.uuid4().hex}/results"
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", url)
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def _stored_files(store: Store) -> dict[str, bytes]:
    return {f"{e}/{f}": store.read(f"{e}/{f}", "test", 1 << 20) for e in store.entries() for f in store.files(e)
            if not f.endswith(".json") or f == "key.json"}


def test_a_url_store_holds_what_a_folder_holds_under_the_same_keys(tmp_path, monkeypatch, memory_store):
    computed = []

    def compute():
        computed.append(1)
        return DEMO

    for root in (memory_store, tmp_path / "folder", f"file://{tmp_path / 'url'}"):
        monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(root))
        assert cache.cached("demo", KEY, compute, version=1).rows == DEMO.rows
        again = cache.cached("demo", KEY, compute, version=1)                 # read back, not computed
        assert again.rows == DEMO.rows and again.provenance["loaded_from_cache"]
        assert [n for n, _ in cache.entries()] == ["demo"]
    assert len(computed) == 3
    stores = [Store(memory_store), Store(tmp_path / "folder"), Store(f"file://{tmp_path / 'url'}")]
    assert Store(f"file://{tmp_path / 'url'}").local == tmp_path / "url"
    tables = [_stored_files(s) for s in stores]
    assert len(tables[0]) == 2 and tables[0] == tables[1] == tables[2]      # the table and the key, byte for byte


def test_a_write_killed_between_the_table_and_its_record_is_a_miss(monkeypatch, memory_store):
    """The CSV written, then the writer killed before the JSON record: nothing is read; the next run computes."""
    from attnlab.core import store as store_module

    real = store_module.Store.write

    def killed_after_the_table(self, rel, data):
        if rel.endswith("demo.json"):
            raise KeyboardInterrupt
        real(self, rel, data)

    monkeypatch.setattr(store_module.Store, "write", killed_after_the_table)
    with pytest.raises(KeyboardInterrupt):
        cache.cached("demo", KEY, lambda: DEMO, version=1)
    monkeypatch.setattr(store_module.Store, "write", real)
    with pytest.warns(UserWarning, match="cannot read"):
        assert cache.stored("demo", dict(KEY, version=1)) is None
    # a record whose table was cut short (a put that is not atomic): a miss with one warning, then computed again
    other = Result("demo", [{"L": 1, "value": 0.75}], {"model": "m"})
    store, entry = Store(memory_store), cache._entry("demo", dict(KEY, version=1))
    files = other.to_files(key=cache.key_hash(dict(KEY, version=1)))
    store.write(f"{entry}/demo.json", files["demo.json"])
    store.write(f"{entry}/demo.csv", files["demo.csv"][:-3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.stored("demo", dict(KEY, version=1)) is None
    assert [str(w.message) for w in caught if "differs from the one saved" in str(w.message)]
    with pytest.warns(UserWarning, match="differs from the one saved"):
        assert cache.cached("demo", KEY, lambda: DEMO, version=1).rows == DEMO.rows
    assert cache.stored("demo", dict(KEY, version=1)).rows == DEMO.rows


def test_a_local_write_killed_mid_file_leaves_only_a_temporary_file(tmp_path, monkeypatch):
    """In a folder a file is written under a temporary name and renamed: a kill before the rename leaves the
    temporary file, which no reader opens."""
    import os

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))

    def killed(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        cache.cached("demo", KEY, lambda: DEMO, version=1)
    monkeypatch.undo()
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    assert not [p for p in tmp_path.rglob("demo.*")]
    assert cache.stored("demo", dict(KEY, version=1)) is None
