"""numba kernels: the per-row loops of `normalization.metrics` and `normalization.readings` in one pass over
each row's keys (CPU only; compiled once and cached on disk in attnlab's cache).

    metrics    root sums, top-k, d1 lookups and the critical-N scan (imported first: it sets the cache folder)
    gradients  the secular-equation solver of Lemma 2's exact Jacobian norm
    readings   the brackets and random orders of the readings' critical-N scan

One switch decides whether they run: `normalization.metrics.engine.FUSED` (ATTNLAB_KERNELS=0 turns them off);
callers reach them through `engine.cpu_kernels(t)`, which also declines non-CPU tensors.
"""
