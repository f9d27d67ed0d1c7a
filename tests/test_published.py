"""Published Results (issue #38, item 2): the site carries the Results it was built from; a reader's kernel
fetches a missing one by key from a site served on 127.0.0.1, sha256-checked, instead of computing it."""
import functools
import http.server
import json
import shutil
import socket
import threading
import time
from pathlib import Path

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
    data = victim.read_bytes()
    victim.write_bytes(data[:-1] + (b"!" if data[-1:] != b"!" else b"?"))      # same size, another sha256
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


# --------------------------------------------------------------------------- a slow or oversized site (issue #46, 6)

class Hostile(http.server.SimpleHTTPRequestHandler):
    """Serves the site folder, except: "trickle" paths get Content-Length: `trickle_length` (none if "") and then
    one byte every 0.5 s (at most `bytes_at_most`, stopped by `stop`); "pad" paths get their file plus 1000 bytes,
    with a Content-Length that says so ("stated") or none ("unstated": the bytes must be counted)."""

    trickle, trickle_length, pad, stated, bytes_at_most = "", "100000", "", True, 60
    stop: threading.Event
    requests: list

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.requests.append(self.path)
        if self.trickle and self.path.startswith(self.trickle):
            self.send_response(200)
            if self.trickle_length:
                self.send_header("Content-Length", self.trickle_length)
            self.end_headers()
            for _ in range(self.bytes_at_most):
                if self.stop.wait(0.5):
                    return
                try:
                    self.wfile.write(b"{")
                    self.wfile.flush()
                except OSError:                      # the reader gave up: done
                    return
            return
        if self.pad and self.path.startswith(self.pad):
            body = (Path(self.directory) / self.path.lstrip("/")).read_bytes() + b" " * 1000
            self.send_response(200)
            if self.stated:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    """(site root, url, handler class) for a `Hostile` server on 127.0.0.1, stopped after the test; the site's
    give-up state is cleared before and after."""
    root = tmp_path / "site"
    root.mkdir()
    handler = type("H", (Hostile,), {"stop": threading.Event(), "requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    published._given_up.clear()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/", handler
    handler.stop.set()
    server.shutdown()
    server.server_close()
    published._given_up.clear()


def _site_lines(err: str) -> list[str]:
    """stderr's lines from attnlab, but the cache's "computed ..." announcements."""
    return [line for line in err.splitlines() if line.startswith("attnlab:") and " computed " not in line]


def test_a_site_that_trickles_its_registry_is_given_up_at_the_deadline(results, hostile, monkeypatch, capsys):
    """Content-Length: 100000, then a byte every 0.5 s: each read succeeds within the 5 s timeout, so the reader
    waited for ever (> 300 s); the whole download now has a deadline, then the Result is computed."""
    root, url, handler = hostile
    handler.trickle = "/results/registry.json"
    monkeypatch.setattr(published, "DEADLINE_S", 1.5)
    monkeypatch.setenv(published.URL_ENV, url)
    start = time.monotonic()
    assert cache.cached("probe", KEY, computed, version=1).rows == computed().rows
    took = time.monotonic() - start
    assert 1.5 <= took < 10, took
    lines = _site_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "is too slow: results/registry.json not complete in 1.5 s" in lines[0], lines
    assert "computing what is missing" in lines[0]
    asked = len(handler.requests)
    published._registry.cache_clear()               # even with the registry asked anew: that site is given up
    assert published.fetch("probe", "0" * 16) is None
    assert len(handler.requests) == asked == 1 and not capsys.readouterr().err


def test_a_file_that_trickles_is_given_up_and_the_site_not_asked_again(results, hostile, tmp_path, monkeypatch,
                                                                       capsys):
    root, url, handler = hostile
    publish_one(results, root, tmp_path, monkeypatch)
    handler.trickle, handler.trickle_length = "/results/files/", ""        # within the size cap, but slow
    monkeypatch.setattr(published, "DEADLINE_S", 1.0)
    monkeypatch.setenv(published.URL_ENV, url)
    start = time.monotonic()
    got = cache.cached("probe", KEY, computed, version=1)
    assert time.monotonic() - start < 10 and "published_by" not in got.provenance
    lines = _site_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "is too slow: probe's" in lines[0] and "computing probe" in lines[0], lines
    asked = len(handler.requests)
    shutil.rmtree(results)
    assert cache.cached("probe", KEY, computed, version=1).rows == computed().rows
    assert len(handler.requests) == asked and not _site_lines(capsys.readouterr().err)


@pytest.mark.parametrize("stated", [True, False], ids=["content-length", "no-content-length"])
def test_a_file_larger_than_the_registry_states_is_refused(stated, results, hostile, tmp_path, monkeypatch, capsys):
    root, url, handler = hostile
    publish_one(results, root, tmp_path, monkeypatch)
    handler.pad, handler.stated = "/results/files/", stated
    monkeypatch.setenv(published.URL_ENV, url)
    got = cache.cached("probe", KEY, computed, version=1)
    assert "published_by" not in got.provenance and got.rows == computed().rows
    lines = _site_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "is too large: probe's" in lines[0], lines
    assert ("bytes, at most" if stated else "sends more than the") in lines[0]


def test_the_registry_states_each_size_and_an_old_registry_without_sizes_still_works(results, site, tmp_path,
                                                                                     monkeypatch):
    root, url = site
    publish_one(results, root, tmp_path, monkeypatch)
    registry_file = root / "results" / "registry.json"
    registry = json.loads(registry_file.read_text())
    (record,) = registry["results"].values()
    files = root / "results" / "files"
    assert record["sizes"] == {f: (files / sha).stat().st_size for f, sha in record["files"].items()}
    del record["sizes"]
    registry_file.write_text(json.dumps(registry))
    monkeypatch.setenv(published.URL_ENV, url)
    assert cache.cached("probe", KEY, never, version=1).provenance["published_by"] == url


def test_the_size_cap_is_the_stated_size_bounded_by_the_constant():
    assert published._size_cap({"sizes": {"a.csv": 12}}, "a.csv") == 12
    assert published._size_cap({"sizes": {"a.csv": 1 << 40}}, "a.csv") == published.FILE_MAX_BYTES
    for record in ({}, {"sizes": None}, {"sizes": {"a.csv": "12"}}, {"sizes": {"a.csv": -1}}, {"sizes": {}}):
        assert published._size_cap(record, "a.csv") == published.FILE_MAX_BYTES
