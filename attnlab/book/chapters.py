"""The chapter map and the verdict summary: which chapter checks which claim (`CHAPTER_CLAIMS`, from the claim
registries), and each claim's verdict per model it was computed with."""
from __future__ import annotations

from typing import Optional, Sequence

from attnlab.book.markup import table
from attnlab.normalization.claim_kinds import chapter_labels
from attnlab.sample_complexity.claims import chapter_labels as tsc_labels


# chapter -> (title, page, the claim ids it checks, with a short label each: from the claim registries, paper 1's
# normalization/claims.toml and paper 2's sample_complexity/claims.toml)
CHAPTER_CLAIMS = (
    ("1", "Vanishing attention", "01_vanishing", chapter_labels("1")),
    ("2", "Distance collapse", "02_distance_collapse", chapter_labels("2")),
    ("3", "The 6% rule", "03_six_percent", chapter_labels("3")),
    ("4", "Geometric separability", "04_separability", chapter_labels("4")),
    ("5", "Gradient sensitivity", "05_gradients", chapter_labels("5")),
    ("6", "What holds", "06_what_holds", {}),
    ("7", "Beyond softmax", "07_beyond_softmax", {}),
    ("8", "Diagnose your model", "08_diagnose", {}),
    ("9", "Attention on infinitely many tokens", "09_infinite_tokens", tsc_labels("9")),
    ("10", "Real tokens", "10_real_tokens", tsc_labels("10")),
)
CHAPTER_NOTES = {"6": "every claim above in one table, with the caveats", "7": "other normalizers swapped into the "
                 "model (no claim of the papers)", "8": "the same measurements on any model"}


def default_rows(rows: Sequence[dict]) -> dict[str, dict]:
    """claim id -> its row at the book's default readings (rows with no `reading`; the other readings' rows share
    their ids), and of a claim measured under one reading only (chapter 10's per-head claim) its one row."""
    out = {r["id"]: r for r in rows if not r.get("reading")}
    only: dict[str, list[dict]] = {}
    for r in rows:
        if r["id"] not in out:
            only.setdefault(r["id"], []).append(r)
    return {**out, **{cid: v[0] for cid, v in only.items() if len(v) == 1}}


def default_verdicts(rows: Sequence[dict]) -> dict[str, str]:
    """claim id -> verdict of its `default_rows` row."""
    return {cid: r["verdict"] for cid, r in default_rows(rows).items()}


def row_model(row: dict) -> Optional[str]:
    """The model a claim row was computed with: its `model`, set from its Result's provenance
    (`attnlab.core.verdicts.with_model`); None: synthetic tokens, no model."""
    if "model" not in row:
        raise ValueError(f"claim row {row.get('id')!r} has no `model` (attnlab.core.verdicts.with_model sets it)")
    return row["model"]


#: the column (chapter map) and the group (verdict summary) of claims whose Results used no model
NO_MODEL = "synthetic tokens<br><small>no model</small>"


def chapter_map(rows: Sequence[dict], per_model: Optional[dict[str, list[dict]]] = None,
                fragile: Optional[dict[str, list[str]]] = None):
    """HTML table: chapter, the claims it checks (the chapter above its first claim: one column fewer, so the
    verdicts stay on a phone's screen), and a verdict column per model: each claim's verdict stands in the column
    of the model its row was computed with (`row_model`, from its Result's provenance), the claims on synthetic
    tokens in a last "no model" column, '—' elsewhere. `per_model` ({model: rows}, `claims_per_model`) adds each
    model's paper-1 verdicts (those columns first, in its order); `fragile` ({claim id: models},
    `fragile_claims`) marks the verdicts that depend on the text window on a model."""
    per_model = per_model or {}
    at: dict[tuple, str] = {}                       # (claim id, model) -> verdict
    for model_rows in (rows, *per_model.values()):
        for cid, r in default_rows(model_rows).items():
            at[(cid, row_model(r))] = r["verdict"]
    seen = list(dict.fromkeys(m for _, m in at))
    columns = list(per_model) + [m for m in seen if m not in per_model and m is not None] + [None] * (None in seen)
    fragile = fragile or {}

    def cell(cid: str, m: Optional[str]) -> str:
        if (cid, m) not in at:
            return "not computed" if cid.startswith("p1-") and m in per_model else "—"
        mark = " ⚠ <small>depends on the window</small>" if m in fragile.get(cid, ()) else ""
        return f"<b>{at[(cid, m)]}</b>{mark}"

    out = []
    for number, title, page, labels in CHAPTER_CLAIMS:
        link = f'<b><a href="{page}.html">{number}. {title}</a></b>'
        if not labels:
            out.append([f"{link}<br>{CHAPTER_NOTES.get(number, '')}"] + [""] * len(columns))
        for i, (cid, label) in enumerate(labels.items()):
            out.append([(f"{link}<br>" if i == 0 else "") + label] + [cell(cid, m) for m in columns])
    heads = [NO_MODEL if m is None else f"{m}<br><small>{per_model[m][0].get('model_kind', '')}</small>"
             if per_model.get(m) else m for m in columns]
    return table(["chapter and claim"] + heads, out)


def verdict_summary(rows: Sequence[dict]):
    """HTML: the claims of the chapter map grouped by the model they were computed with (`row_model`: "Computed
    with <model>", then the claims on synthetic tokens), and within each by verdict (holds / does not hold / not
    applicable); claims without a row last, as not computed."""
    from IPython.display import HTML

    from attnlab.core.names import display_name

    chosen = default_rows(rows)
    groups: dict[str, dict[str, list[str]]] = {}
    for number, _, page, labels in CHAPTER_CLAIMS:
        for cid, label in labels.items():
            r = chosen.get(cid)
            model = "not computed" if r is None else row_model(r)
            groups.setdefault(model, {}).setdefault(r["verdict"] if r else "not computed", []).append(
                f'<li>{label} (<a href="{page}.html">chapter {number}</a>)</li>')
    order = [m for m in groups if m not in (None, "not computed")] + [m for m in (None, "not computed") if m in groups]
    parts = []
    for m in order:
        title = ("Computed on synthetic tokens (no model)" if m is None else "Not computed on this build"
                 if m == "not computed" else f"Computed with {display_name(m)}")
        parts.append(f'<p class="attnlab-model-group"><strong>{title}</strong></p>')
        parts += [f"<p><b>{v}</b> ({len(items)})</p><ul>{''.join(items)}</ul>"
                  for v in ("holds", "does not hold", "not applicable", "not computed") if (items := groups[m].get(v))]
    return HTML("".join(parts))
