"""Tools beyond the papers, built on both: normalizers (softmax/T, sparsemax, entmax, SSMax, SA-softmax),
compare (normalizers swapped into a model), diagnose (any model on any text), report (their views)."""
