"""What a reader is told a short model name means (chapter boxes, the site's footer): one place for it. A module
of its own so that the book's Sphinx extension reads it without importing torch."""
from __future__ import annotations

DISPLAY_NAMES = {
    "gpt2": "GPT-2 124M",
    "minilm": "all-MiniLM-L6-v2 (sentence encoder)",
    "smollm2": "SmolLM2-135M-Instruct (causal decoder, 4-bit weights)",
    "tiny-gpt2": "tiny-gpt2 (a 2-layer test model)",
    "gpt2-random": "GPT-2 124M's shape with random weights",
}


def display_name(name: str) -> str:
    """The name a reader sees for a model name ("smollm2" -> "SmolLM2-135M-Instruct (causal decoder, 4-bit
    weights)"); any other name (a hub id, a folder, a file) as it is."""
    return DISPLAY_NAMES.get(name, name)
