"""Published Results (issue #38, item 2): the site carries the Results it was built from; a reader's kernel
fetches a missing one by key from a site served on 127.0.0.1, sha256-checked, instead of computing it."""
import functools
import http.server
import socket
import threading

import pytest

from attnlab.core import cache, published
from attnlab.core.result import Result


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def results(tmp_path, monkeypatch):
    folder = tmp_path / "results"
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(folder))
    published._registry.cache_clear()
    yield folder
    published._registry.cache_clear()


KEY = {"experiment": "probe", "lengths": [8, 16]}


def computed():
    return Result("probe", [{"L": 8, "value": 0.25}, {"L": 16, "value": 0.125}], {"model": "none"})


def never():
    raise AssertionError("computed although the site has the Result")


def publish_one(results, site_root, tmp_path, monkeypatch):
    """Compute and store the probe Result with the build's log on, publish it, then empty the cache."""
    log = tmp_path / "used.txt"
    monkeypatch.setenv(published.LOG_ENV, str(log))
    cache.cached("probe", KEY, computed)
    monkeypatch.delenv(published.LOG_ENV)
    done = published.publish(log.read_text().split(), results, site_root)
    assert done["entries"] == 1 and done["files"] == 2 and not done["missing"]
    for entry in list(results.iterdir()):
        for f in entry.iterdir():
            f.unlink()
        entry.rmdir()


def test_a_published_result_is_fetched_and_verified_not_computed(results, site, tmp_path, monkeypatch):
    root, url = site
    publish_one(results, root, tmp_path, monkeypatch)
    monkeypatch.setenv(published.URL_ENV, url)
    got = cache.cached("probe", KEY, never)
    assert got.rows == computed().rows
    assert got.provenance["fetched_from_site"] is True
    again = cache.cached("probe", KEY, never)                 # now in the local cache
    assert again.provenance["fetched_from_site"] is False


def test_a_file_edited_on_the_site_is_refused_and_computed(results, site, tmp_path, monkeypatch, capsys):
    root, url = site
    publish_one(results, root, tmp_path, monkeypatch)
    victim = next((root / "results" / "files").iterdir())
    victim.write_bytes(victim.read_bytes() + b" ")
    monkeypatch.setenv(published.URL_ENV, url)
    got = cache.cached("probe", KEY, computed)
    assert got.provenance.get("fetched_from_site") is None       # computed here
    assert "could not fetch" in capsys.readouterr().err
    assert not [p for p in results.glob(".*")]                    # no half-fetched folder left


def test_a_site_without_the_result_or_unreachable_means_compute(results, site, monkeypatch, capsys):
    root, url = site
    monkeypatch.setenv(published.URL_ENV, url)                  # serves no registry
    assert cache.cached("probe", KEY, computed).rows == computed().rows
    with socket.socket() as s:                                   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    published._registry.cache_clear()
    monkeypatch.setenv(published.URL_ENV, f"http://127.0.0.1:{port}")
    assert published.fetch("probe-0000", results) is False
    assert "no published Results" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["", "off", "0"])
def test_fetching_can_be_switched_off(value, monkeypatch):
    monkeypatch.setenv(published.URL_ENV, value)
    assert published.results_url() is None


def test_the_site_url_ends_in_a_slash(monkeypatch):
    monkeypatch.setenv(published.URL_ENV, "https://example.org/book")
    assert published.results_url() == "https://example.org/book/"
