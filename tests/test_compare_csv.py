"""scripts/compare_csv.py (the CUDA-against-CPU comparison of scripts/gpu_check.sh): it finds the largest relative
difference and its column, counts differing text cells, treats NaN = NaN as equal and says when shapes differ."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("compare_csv", Path(__file__).parents[1] / "scripts" / "compare_csv.py")
compare_csv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_csv)


def _write(d: Path, text: str) -> Path:
    d.mkdir(exist_ok=True)
    (d / "fig1.csv").write_text(text)
    return d / "fig1.csv"


def test_largest_relative_difference_and_text(tmp_path):
    a = _write(tmp_path / "a", "layer,head,d,kind\n0,0,1.0,x\n0,1,nan,y\n1,0,200.0,z\n")
    b = _write(tmp_path / "b", "layer,head,d,kind\n0,0,1.0,x\n0,1,nan,y\n1,0,200.5,w\n")
    line = compare_csv.compare(a, b)
    assert "3 rows" in line and "0.00249" in line and "(d, row 2)" in line and "text cells differing: 1" in line


def test_equal_and_misshapen(tmp_path):
    a = _write(tmp_path / "a", "x\n1\n2\n")
    assert "max relative difference 0 (-)" in compare_csv.compare(a, a)
    b = _write(tmp_path / "b", "x\n1\n")
    assert "shapes differ" in compare_csv.compare(a, b)
    assert compare_csv.main([str(tmp_path / "a")]) == 2
