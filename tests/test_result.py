"""Result round trip and the results cache."""
import math

from attnlab.core.cache import cached
from attnlab.core.result import Result, provenance


def test_round_trip(tmp_path):
    r = Result("demo", [{"L": 32, "d": 1.5, "ok": True}, {"L": 64, "d": float("nan"), "extra": "x"}],
               provenance(model="m", grid=[1, 2]))
    r.save(tmp_path)
    back = Result.load(tmp_path, "demo")
    assert back.rows[0] == {"L": 32, "d": 1.5, "ok": True, "extra": None}
    assert math.isnan(back.rows[1]["d"]) and back.provenance["grid"] == [1, 2]
    assert back.column("L").tolist() == [32, 64] and back.select(L=64)[0]["extra"] == "x"
    assert "torch" in back.provenance and "created_utc" in back.provenance


def test_cache_computes_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return Result("c", [{"a": 1}], {"model": "m"})

    first = cached("c", {"model": "m", "L": 3}, compute, version=1)
    second = cached("c", {"model": "m", "L": 3}, compute, version=1)
    cached("c", {"model": "m", "L": 4}, compute, version=1)
    assert len(calls) == 2 and first.rows == second.rows and second.provenance["loaded_from_cache"]
