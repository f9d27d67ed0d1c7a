"""arXiv 2508.17821, "Limitations of Normalization in Attention Mechanism": its figures, claims and readings.

Data flows one way, from a model's captured attention (`core.capture.Trace`) to claim rows:

    metrics/    pure functions on attention tensors: one statistic per row (engine: blocks, top-N, root sums;
                rows: Fig. 1; distance: Theorem 1; separability: Theorem 2; gradients: Lemma 2;
                critical_n: the KS scan of the 6% rule)
    kernels/    the numba loops behind metrics/ and readings/ (CPU only; one switch: `metrics.engine.FUSED`,
                ATTNLAB_KERNELS=0 runs plain torch, the path GPUs take)
    readings/   every reading of a formula the paper leaves open (the registry) and one module per statement
                it re-reads: theorem1 (d~ and E), six_percent (the critical N of each pair), theorem2
                (separability), lemma2 (Fig. 4's slope)
    paper, bounds       the paper's numbers and closed-form bounds
    experiments         the six figures from a model and a text (streaming: long windows in blocks)
    concentration       Fig. 3's N_s/N against each head's concentration, from the fig1 and fig3 Results
    plots, claims       their figures and claim rows; claim_kinds: the claim registry (claims.toml: one table
                        per claim, its words, kind, test, unit, threshold, tolerance, failure, chapter)
    oracle              per-row reference implementations (tests and benchmarks only)
    layer_kinds         vanishing attention by layer kind: sliding-window layers against full ones (Gemma 3)
"""
