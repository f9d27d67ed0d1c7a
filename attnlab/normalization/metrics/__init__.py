"""Statistics of attention rows, vectorised over heads and rows: probs [..., Q, K] (and vectors x [..., K, D])
in, one value per row (or per row and N) out; no model, no text, no Result.

    engine        blocks of rows, top-N orders, root sums, input checks (shared by the others)
    rows          Fig. 1: largest weight and entropy
    distance      Theorem 1: d~, E, the Jensen spread, d_max
    separability  Theorem 2: N_s / N and its bounds
    gradients     Lemma 2: the softmax Jacobian norm, finite differences of Alg. 5
    critical_n    the KS test of the 6% rule and the incremental critical-N scan
"""
