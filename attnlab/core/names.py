"""What a reader is told a short model name means (chapter boxes, the site's footer): one place for it. A module
of its own so that the book's Sphinx extension reads it without importing torch."""
from __future__ import annotations

from attnlab.core import model_table

DISPLAY_NAMES = {e.name: e.display for e in model_table.MODELS}      # the model table's words


def display_name(name: str) -> str:
    """The name a reader sees for a model name ("smollm2" -> "SmolLM2-135M-Instruct (causal decoder, 4-bit
    weights)"); any other name (a hub id, a folder, a file) as it is."""
    e = model_table.entry(name)
    return e.display if e is not None else name
