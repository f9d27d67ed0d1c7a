"""arXiv 2512.10656, "Token Sample Complexity of Attention": theory (maps, exact limits, horizon) ->
montecarlo (samplers, fits, moment errors) and protocol (fits, presets, grids) -> experiments (Gaussian
tokens), sphere (the hardmax regime), real_tokens (a pretrained encoder) -> plots, claims."""
