"""Tools beyond the papers, built on both: normalizers (softmax/T, sparsemax, entmax, SSMax, SA-softmax, softpick,
sigmoid attention), compare (normalizers swapped into a model), diagnose (any model on any text; `thresholds`: its
options and defaults, light for the CLI's --help), report (their views), sinks (attention sinks: the weight on
the first and repeated tokens, and the paper's claims without the sink heads)."""
