"""The tested-architectures matrix (`core.architectures`): every causal-LM and text-encoder family of the installed
transformers is exact, refused or skipped with a reason, never different; the README's and the book's tables are
what the matrix gives (about 80 s on a 2-core CPU: the matrix runs once for the module)."""
import importlib.util

import pytest

from attnlab.core import architectures

ROOT = architectures.__file__.rsplit("/attnlab/", 1)[0]


@pytest.fixture(scope="module")
def rows():
    return architectures.matrix()


def test_every_family_is_exact_refused_or_skipped_with_a_reason(rows):
    assert len(rows) == len(architectures.families()) > 100
    differs = [(r["family"], r["why"]) for r in rows if r["status"] not in ("exact", "refused", "skipped")]
    assert differs == []
    assert all(r["why"] for r in rows if r["status"] != "exact")
    exact = [r for r in rows if r["status"] == "exact"]
    assert all(r["probs_diff"] <= architectures.TOL and r["output_diff"] <= architectures.TOL for r in exact)


@pytest.mark.parametrize("family, feature", [("gpt2", None), ("llama", "gqa"), ("bert", None),
                                             ("gemma2", "softcap"), ("gpt_oss", "sinks"),
                                             ("mistral", "sliding_window"), ("qwen3", "qk_norm")])
def test_the_main_families_are_exact_with_their_features(rows, family, feature):
    row = next(r for r in rows if r["family"] == family)
    assert row["status"] == "exact", row["why"]
    assert feature is None or row[feature]


def test_shared_layers_are_refused(rows):
    """ALBERT runs one attention module in every layer: one record per module would keep only the last layer's
    (it loaded before, and its Trace held the second call's weights under layer 0)."""
    row = next(r for r in rows if r["family"] == "albert")
    assert row["status"] == "refused" and "more than once" in row["why"]


def test_the_readme_and_the_book_page_hold_the_matrix_table(rows):
    spec = importlib.util.spec_from_file_location("models_table", f"{ROOT}/scripts/models_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for path, text in script.expected(architectures.table_markdown(rows)).items():
        assert path.read_text() == text, f"{path.name} is stale: run python scripts/models_table.py"


# MiniLM (all-MiniLM-L6-v2) is the BERT family, SmolLM2 the Llama family: the book's two offline models, and GPT-2
DIRECTIONS = {"bert": "bidirectional", "llama": "causal", "gpt2": "causal"}


def test_the_attention_column_is_the_direction_attnlab_reads():
    """BERT's LM-head class sits in transformers' causal-LM mapping, yet its attention is bidirectional: the table's
    attention column comes from `AttnModel.causal` (the mask the model applies), not from the mapping."""
    classes = {family: (cls, kind) for family, cls, kind in architectures.families()}
    for family, words in DIRECTIONS.items():
        row = architectures.check_family(family, *classes[family])
        assert row["status"] == "exact" and architectures.direction(row) == words, (family, row)
        assert f"| `{family}` | {words} | exact" in architectures.table_markdown([row])
    page = open(f"{ROOT}/book/models.md").read()                  # the committed appendix page says the same
    assert all(f"| `{family}` | {words} |" in page for family, words in DIRECTIONS.items())
