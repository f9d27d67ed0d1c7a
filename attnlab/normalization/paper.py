"""The numbers that "Limitations of Normalization in Attention Mechanism" (Mudarisov, Burtsev, Petrova,
State; arXiv 2508.17821, NeurIPS 2025) states or uses: one place for each, imported by the
experiments, plots, claims and tools. Where each comes from is in the book's appendix "How we read the
papers" (labels [P] paper, [B] printed in a published summary, [R] reconstruction, [G] gap)."""
from __future__ import annotations

ARXIV = "2508.17821"
TITLE = "Limitations of Normalization in Attention Mechanism"
CITATION = f"Mudarisov, Burtsev, Petrova, State. {TITLE}. arXiv:{ARXIV} (NeurIPS 2025)"

# Fig. 2c / Alg. 3: the critical top-N of the KS test, "fewer than 6% of the tokens" [P]
CRITICAL_FRAC = 0.06
KS_ALPHA = 0.01

# Fig. 3: N_s/N "declines up to N ~ 16 and then saturates between 0.7 and 0.85" [P]
SEPARABILITY_BAND = (0.70, 0.85)
SATURATION_N = 16
FIG3_NMAX = 32

# Fig. 2a / 2b: N = 5 against L; N in {1, 5, 10, 20, 100} at the largest L [P]
FIG2A_N = 5
FIG2B_NS = (1, 5, 10, 20, 100)
PLATEAU_N = 20            # "increasing N beyond 20 yields diminishing returns" [P]

# Fig. 4 / Alg. 5: eps values and "for T < 0.1 the empirical curves follow the 1/T trend" [P]
EPSILONS = (1e-3, 1e-1, 10.0)
ONE_OVER_T_BELOW = 0.1

# The paper's model and corpus
MODEL = "GPT-2 124M (12 layers x 12 heads, causal, 1024 positions)"
N_HEADS = 12 * 12          # GPT-2 124M's heads: the sample size of each KS test of Fig. 2c
MAX_LENGTH = 1024
