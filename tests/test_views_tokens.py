"""Chapter 9's views: the cached experiment runner, the map frame and the frames and tables of its Results."""
import matplotlib
import matplotlib.pyplot
import pytest

matplotlib.use("Agg")

from attnlab.core.result import Result  # noqa: E402
from attnlab.views import tokens as views  # noqa: E402

NS = (100, 1000)


def _fit(**kw):
    return dict({"kind": "fit", "reference": "exact", "slope": -0.5, "slope_se": 0.01, "intercept": 0.0, "beta": 0.5,
                 "beta_ref": 0.4, "horizon": 1.0, "horizon_authors": 2.0, "curvature": 0.0, "curvature_se": 0.01,
                 "ref_norm": 2.0, "C": 1.0, "C_pred": 1.1}, **kw)


def _points(**kw):
    return [dict({"kind": "point", "reference": "exact", "n": n, "err_mean": n ** -0.5, "err_se": 0.001}, **kw)
            for n in NS]


def test_run_caches_each_experiment_and_passes_the_device(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    calls = []

    def fake(device, k):
        calls.append((device, k))
        return Result("tsc_hardmax", [{"k": k}])

    monkeypatch.setitem(views.EXPERIMENTS, "hardmax", ("tsc_hardmax", fake, 1))
    assert views.run("hardmax", "cpu", k=3).rows == [{"k": 3}]
    assert views.run("hardmax", "cpu", k=3).rows == [{"k": 3}]          # from the cache: not computed again
    views.run("hardmax", "cpu", k=4)
    assert calls == [("cpu", 3), ("cpu", 4)]


@pytest.mark.parametrize("experiment", ["uniform_map", "moment_convergence"])
def test_a_second_run_of_a_chapter_9_experiment_is_a_cache_hit(tmp_path, monkeypatch, experiment):
    """They were stored as tsc_uniform_map / tsc_moment_convergence while their Results are named tsc_uniform /
    tsc_moments, so the lookup never hit: recomputed on every build."""
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    first = views.run(experiment, "cpu", quick=True)
    again = views.run(experiment, "cpu", quick=True)
    assert not first.provenance.get("loaded_from_cache")
    assert again.provenance.get("loaded_from_cache") and again.name == first.name
    assert [r.get("slope") for r in again.rows] == [r.get("slope") for r in first.rows]


def test_map_frame_draws_three_sets_against_the_limit():
    fig = views.map_frame(2.0, 100)
    ax = fig.axes[0]
    assert ax.get_title() == "H = 2, n = 100"
    assert len([ln for ln in ax.get_lines() if ln.get_color() == "C1"]) == 3 + 2   # the draws, the extremes
    assert views.QUERIES.shape == (161, 1)


def test_uniform_and_moment_frames_and_tables():
    res_u = Result("u", [_fit(R=R, C=R) for R in (1.0, 2.0)] + _points(R=1.0) + _points(R=2.0))
    legend = views.uniform_frame(res_u, 2.0).axes[0].get_legend().get_texts()
    assert sorted(t.get_text() for t in legend) == ["R = 2", "fit: slope -0.50"]
    rows = [_fit(scale=s, moment=m) for s in (0.5, 5.0) for m in ("mean", "cov")]
    rows += [p for s in (0.5, 5.0) for m in ("mean", "cov") for p in _points(scale=s, moment=m)]
    res_m = Result("m", rows)
    assert views.moment_frame(res_m, 5.0).axes[0].get_title() == "s = 5, H = 1, β(H) = 0.25"
    html = views.moment_table(res_m).data
    assert html.count("<tr>") == 3 and "0.500 ± 0.010" in html
    html = views.hardmax_table(res_m).data
    assert ">0.02<" in html and html.count("<tr>") == 3     # relative error at n = 1000: 1000^-0.5 / 2 = 0.016


def test_reference_and_fit_frames():
    rows = [_fit(moment=m, reference=r) for m in ("mean", "cov") for r in ("exact", "sample")]
    rows += [p for m in ("mean", "cov") for r in ("exact", "sample") for p in _points(moment=m, reference=r)]
    res_ref = Result("ref", rows, {"n_ref": 20000})
    fig = views.reference_frame(res_ref, "sample", "cov")
    assert fig.axes[0].get_title() == "covariance error, s = 50, H = 1.00"
    assert "20,000-token sample [CODE]: slope -0.500" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    res_h = Result("h", [p for s in (1.0, 10.0) for p in _points(scale=s, moment="cov")])
    ols_wls = {(s, "cov", m): {"slope": -0.1 * s, "slope_se": 0.01, "intercept": 0.0}
               for s in (1.0, 10.0) for m in ("ols", "wls")}
    fig = views.fit_frame(res_h, ols_wls, "wls")
    assert fig.axes[0].get_title() == "sphere, covariance error, WLS fit"
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["s = 1: slope -0.100",
                                                                           "s = 10: slope -1.000"]


def test_map_departure_finds_where_the_map_leaves_its_limit():
    dep = views.map_departure(2.0, 2000)
    assert 0 < dep["x_away"] <= 4 and dep["band"] > 0
    assert 2.0 < dep["y_max"] < 5.0                                  # about sqrt(2 log n) = 3.9
    assert dep["y_max"] / 2.0 > dep["x_away"] * 0.5                  # it bends away before Hx meets the ceiling
    assert views.map_departure(2.0, 2000, tol=1e9)["x_away"] == 4.0   # never away: the last query


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")
