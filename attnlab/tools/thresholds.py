"""The options of `diagnose` and their defaults, without torch: the CLI's --help reads them (`attnlab.cli.diagnose`)."""
from __future__ import annotations

from dataclasses import dataclass

from attnlab.normalization import paper

DEFAULT_LENGTHS = (64, 128, 256, 512, 1024)   # powers of two up to the paper's 1024, capped by the model
N_TOP = paper.FIG2A_N          # d~ at N = 5, as in the paper's Fig. 2a
N_SEP = paper.SATURATION_N     # N_s/N at N = 16: the paper's Fig. 3 saturates from N ~ 16 on
MAX_ROWS = 64
ALPHA = paper.KS_ALPHA


@dataclass(frozen=True)
class Thresholds:
    """The flag rules in one place. Each flag cuts a saturation score (`saturation_score`: 0 at the
    statistic's unsaturated end, 1 at its value under uniform attention over the same head's rows and
    vectors) at score >= its cut; the paper's numbers (`PAPER`, GPT-2) are shown, not used as cuts."""

    entropy: float = 0.9        # near_uniform: H / log L_t (one-hot 0, uniform 1) >= entropy
    separability: float = 0.9   # low_separability: (1 - N_s/N) / (1 - N_s/N of uniform) >= separability ...
    sharp_gate: float = 0.5     # ... for heads whose entropy score >= sharp_gate only (N_s/N also falls at one-hot)
    critical: float = 0.9       # critical_n: (n_max - N*) / (n_max - N* of uniform) >= critical (n_max: scan's end)

    def check(self) -> "Thresholds":
        cuts = (self.entropy, self.separability, self.critical)
        if not all(0 < v <= 1 for v in cuts) or not 0 <= self.sharp_gate < 1:
            raise ValueError(f"thresholds out of range: {self} (entropy, separability, critical in (0, 1], "
                             "sharp_gate in [0, 1))")
        return self

    def rules(self) -> dict[str, str]:
        """flag -> its rule in words (provenance, report, summary)."""
        return {
            "near_uniform": f"entropy score H / log L_t >= {self.entropy:g} (one-hot 0, uniform 1)",
            "low_separability": f"separability score (1 - N_s/N) / (1 - N_s/N of uniform) >= {self.separability:g} "
                                f"(N_s/N = 1: 0, uniform: 1), heads with entropy score >= {self.sharp_gate:g} only",
            "critical_n": f"critical-N score (n_max - N*) / (n_max - N* of uniform) >= {self.critical:g} "
                          "(censored: <= 0, uniform: 1)",
        }
