"""Published Results (issue #38, item 2): the site carries the Results it was built from; a reader's kernel
fetches a missing one by key from a site served on 127.0.0.1, sha256-checked, instead of computing it."""
import functools
import http.server
import shutil
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
    cache.cached("probe", KEY, computed, version=1)
    monkeypatch.delenv(published.LOG_ENV)
    done = published.publish(log.read_text().split(), results, site_root)
    assert done["entries"] == 1 and done["files"] == 3 and not done["missing"]
    shutil.rmtree(results)


def test_a_published_result_is_fetched_and_verified_not_computed(results, site, tmp_path, monkeypatch):
    root, url = site
    publish_one(results, root, tmp_path, monkeypatch)
    monkeypatch.setenv(published.URL_ENV, url)
    got = cache.cached("probe", KEY, never, version=1)
    assert got.rows == computed().rows
    assert got.provenance["fetched_from_site"] is True and got.provenance["published_by"] == url
    again = cache.cached("probe", KEY, never, version=1)                 # now in the local cache
    assert "fetched_from_site" not in again.provenance and again.provenance["published_by"] == url


def test_another_torch_still_finds_the_published_result_and_says_so(results, site, tmp_path, monkeypatch):
    """The site's Result was computed with the build's libraries; a reader with another torch gets it by the key
    without the environment, and its provenance names the environment it was computed in."""
    root, url = site
    publish_one(results, root, tmp_path, monkeypatch)
    built = dict(cache.library_versions())
    monkeypatch.setattr(cache, "library_versions", lambda: {**built, "torch": "0.0-other"})
    monkeypatch.setenv(published.URL_ENV, url)
    got = cache.cached("probe", KEY, never, version=1)
    assert got.provenance["published_environment"]["libraries"] == built


def test_a_file_edited_on_the_site_is_refused_and_computed(results, site, tmp_path, monkeypatch, capsys):
    root, url = site
    publish_one(results, root, tmp_path, monkeypatch)
    victim = next((root / "results" / "files").iterdir())
    victim.write_bytes(victim.read_bytes() + b" ")
    monkeypatch.setenv(published.URL_ENV, url)
    got = cache.cached("probe", KEY, computed, version=1)
    assert "published_by" not in got.provenance                  # computed here
    assert "could not fetch" in capsys.readouterr().err
    assert not [p for p in results.glob(".*") if p.name != cache.LOCKS]   # no half-fetched folder left


def test_a_site_without_the_result_or_unreachable_means_compute(results, site, monkeypatch, capsys):
    root, url = site
    monkeypatch.setenv(published.URL_ENV, url)                  # serves no registry
    assert cache.cached("probe", KEY, computed, version=1).rows == computed().rows
    with socket.socket() as s:                                   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    published._registry.cache_clear()
    monkeypatch.setenv(published.URL_ENV, f"http://127.0.0.1:{port}")
    assert published.fetch("probe", "0" * 16) is None
    assert "no published Results" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["", "off", "0"])
def test_fetching_can_be_switched_off(value, monkeypatch):
    monkeypatch.setenv(published.URL_ENV, value)
    assert published.results_url() is None


def test_the_site_url_ends_in_a_slash(monkeypatch):
    monkeypatch.setenv(published.URL_ENV, "https://example.org/book")
    assert published.results_url() == "https://example.org/book/"
