"""Chapter 7's view (attnlab.views.normalizers): the comparison table's cells."""
import re

from attnlab.core.result import Result
from attnlab.views import normalizers as views


def test_comparison_table_at_the_longest_length():
    base = dict(max_weight=0.5, entropy_norm=0.25, weight_sum=1.0, ns_frac=0.75, critical_n_censored=False,
                critical_n_frac=0.8125, critical_n_max=63, jac_norm_mean=0.1, loss=3.0)
    rows = [dict(base, L=32, normalizer="softmax(T=1.0)", loss_delta=0.0),
            dict(base, L=64, normalizer="softmax(T=1.0)", loss_delta=0.0),
            dict(base, L=64, normalizer="sparsemax", critical_n_censored=True, loss_delta=0.125)]
    cells = re.findall(r"<td [^>]*>(.*?)</td>", views.comparison_table(Result("cmp", rows, {})).data)
    assert len(cells) == 2 * 8                                        # L = 64 only: two normalizers, eight columns
    assert cells[:8] == ["softmax(T=1.0)", "0.5", "0.25", "1", "0.75", "0.812", "0.1", "0 (the model itself)"]
    assert cells[8:] == ["sparsemax", "0.5", "0.25", "1", "0.75", "> 0.98", "0.1", "0.125"]
