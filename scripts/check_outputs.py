#!/usr/bin/env python3
"""The committed chapters' stored outputs against those of the book build just made (what Colab and Binder
open first must be what the build computes), so that a test run executes each chapter once.

Every code cell's outputs in the committed notebook (book/NAME.ipynb) must equal those of the executed copy
the build wrote (_build/jupyter_execute/book/NAME.ipynb), cells matched by id, with nbval's rules: every
output key and every mime type compared, except metadata, tracebacks, execution counts, stream names, images
and widget model ids; consecutive stream outputs are merged (the build merges them, nbclient does not); the
figures' phone versions are not compared (`desktop_only`).
What changes from run to run is masked: the values marked volatile where they are made
(`attnlab.core.style.volatile`) and images inside HTML.

A committed chapter holds each figure once, at its desktop size, in its HTML (what Jupyter, Colab and GitHub show):
the phone versions attnlab.widgets draws (a <picture>'s <source>, a slider's "phone" frames) and the image/png
copy of a figure its HTML holds stay in the build's executed copies and its execution cache, from which the site
is made, and a refresh leaves them out (`stored`), so that a chapter opens quickly and stays under MAX_BYTES
(tests/test_committed_notebooks.py).

When the build ran another model than the one the committed chapter shows (`make test MODEL=minilm`), only
its checked cells are compared: those whose first line is `# NBVAL_CHECK_OUTPUT` or that carry the tag
`nbval-check-output` (nbval's markers), which print only what holds on any model.

    python scripts/check_outputs.py [_build]             # exit 1 and a diff on any difference
    python scripts/check_outputs.py --refresh [_build]   # copy the build's outputs into book/*.ipynb
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK, TAG = "# NBVAL_CHECK_OUTPUT", "nbval-check-output"
SKIP = {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count", "image/png",
        "image/jpeg", "application/vnd.jupyter.widget-view+json"}
# What differs between two runs of the same code on the same model is printed through one helper that marks it
# (attnlab.core.style.volatile: a duration, a throughput, a fastest-method pick); the check masks those marks and
# nothing else, so a new sentence with a timing that skips the helper fails here on the first fresh machine's run.
VOLATILE_ATTR = "data-attnlab-volatile"                            # attnlab.core.style.VOLATILE_ATTR
MASKS = (
    (re.compile(r"base64,[A-Za-z0-9+/=]+"), "base64,…"),          # images inside HTML (like image/png: not compared)
    (re.compile(rf"(<span\b[^>]*\b{VOLATILE_ATTR}\b[^>]*>)[^<]*(</span>)"), r"\1…\2"),   # volatile marks
)
MODEL = re.compile(r'data-attnlab-model="([^"]*)"')                 # book.model_admonition's mark
#: the most a committed chapter may weigh (bytes): a learner's Colab, Jupyter or GitHub opens it quickly
MAX_BYTES = 1_000_000
# attnlab.widgets._img_tag: a figure with a phone version is <picture><source (phone)><img (desktop)></picture>, its
# <img> carrying the phone version's smallest text; widgets.slider_html lists a slider's phone frames as srcset
# strings ("data:... 1.5x") in its JSON, where the desktop frames are bare data URIs.
_PICTURE = re.compile(r'<picture><source media="[^"]*" srcset="[^"]*"[^>]*>(<img\b[^>]*?)'
                      r'(?: data-phone-text-pt="[^"]*")?></picture>')
_PHONE_FRAME = re.compile(r'"data:image/png;base64,[A-Za-z0-9+/=]+ [0-9.]+x"')


def checked(cell: dict) -> bool:
    source = "".join(cell.get("source", "")).lstrip()
    return cell["cell_type"] == "code" and (source.startswith(MARK) or TAG in cell.get("metadata", {}).get("tags", []))


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def masked(text: str) -> str:
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def shown(outputs: list[dict]) -> list[dict]:
    """The outputs a reader is shown, as the site shows them (`nb_output_stderr: remove`): without stderr, where
    a run's library chatter goes (a one-time "de-quantizing ... kept in <cache path>", warnings that name the
    kernel's temporary cell file)."""
    return [o for o in outputs if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]


def desktop_only(html: str) -> str:
    """An output's HTML without its figures' phone versions: each <picture> becomes its desktop <img>, each slider's
    phone frames null; what attnlab.widgets writes for figures drawn without one."""
    return _PHONE_FRAME.sub("null", _PICTURE.sub(r"\1>", html))


def stored(outputs: list[dict]) -> list[dict]:
    """The outputs a committed chapter keeps: those `shown`, each HTML `desktop_only`, and no image/png that the
    HTML holds already (a figure's, a slider's first frame: Jupyter, Colab and GitHub show the HTML); other
    outputs as they are."""
    kept = []
    for out in shown(outputs):
        data = out.get("data", {})
        if "text/html" in data:
            html = desktop_only(_text(data["text/html"]))
            data = {k: v for k, v in data.items() if k != "text/html"} | {"text/html": html}
            png = "".join(_text(data.get("image/png", "")).split())
            if png and f'base64,{png}"' in html:
                del data["image/png"]
            out = dict(out, data=data)
        kept.append(out)
    return kept


def normalized(outputs: list[dict]) -> list[dict]:
    """Outputs as nbval compares them: what a committed chapter keeps (`stored`), streams merged, skipped keys
    dropped, text joined and masked."""
    merged: list[dict] = []
    for out in stored(outputs):
        if out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream" \
                and merged[-1].get("name") == out.get("name"):
            merged[-1] = dict(merged[-1], text=_text(merged[-1]["text"]) + _text(out["text"]))
        else:
            merged.append(out)
    flat = []
    for out in merged:
        item = {k: masked(_text(v)) for k, v in out.items() if k not in SKIP and k != "data"}
        item.update({k: masked(_text(v)) if isinstance(v, str) or isinstance(v, list) and all(
            isinstance(x, str) for x in v) else v for k, v in out.get("data", {}).items() if k not in SKIP})
        flat.append(item)
    return flat


def models(nb: dict) -> set[str]:
    """The models a chapter's outputs name (book.model_admonition's data-attnlab-model marks)."""
    return {m for c in nb["cells"] for out in c.get("outputs", [])
            for m in MODEL.findall(_text(out.get("data", {}).get("text/html", "")))}


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _pairs(ref: dict, new: dict, name: str) -> tuple[list[tuple[int, dict, dict]], list[str]]:
    """(index, committed cell, executed cell) of every code cell, and the cells that do not pair: missing
    from the executed copy, or with another source there (the build is of other sources)."""
    new_cells = {c.get("id"): c for c in new["cells"]}
    pairs, problems = [], []
    for i, cell in enumerate(ref["cells"]):
        if cell["cell_type"] != "code":
            continue
        got = new_cells.get(cell.get("id"))
        if got is None or got["cell_type"] != "code":
            problems.append(f"{name} cell {i} ({cell.get('id')}): missing from the executed notebook")
        elif _text(got.get("source", "")) != _text(cell.get("source", "")):
            problems.append(f"{name} cell {i} ({cell.get('id')}): its source differs in the executed notebook "
                            "(build again from these sources)")
        else:
            pairs.append((i, cell, got))
    return pairs, problems


def compare(reference: Path, executed: Path) -> list[str]:
    """Differences between the committed notebook and the build's executed copy (empty: equal). Every code
    cell is compared when both ran the same model, else only the checked cells."""
    ref, new = _read(reference), _read(executed)
    every = models(ref) == models(new)
    pairs, problems = _pairs(ref, new, reference.name)
    for i, cell, got in pairs:
        if not (every or checked(cell)):
            continue
        stored, executed_out = normalized(cell.get("outputs", [])), normalized(got.get("outputs", []))
        if stored != executed_out:
            problems.append(f"{reference.name} cell {i} ({cell.get('id')}):\n  stored:   {stored}\n"
                            f"  executed: {executed_out}")
    return problems


def refresh(reference: Path, executed: Path) -> int:
    """Copy the executed copy's outputs (those a committed chapter keeps: `stored`) and execution counts into the
    committed notebook (sources, metadata and markdown untouched; no widget state, as `make notebooks`). Returns
    the code cells whose outputs changed. Raises ValueError, writing nothing, when a code cell is missing there or
    has another source."""
    ref, new = _read(reference), _read(executed)
    pairs, problems = _pairs(ref, new, reference.name)
    if problems:
        raise ValueError("; ".join(problems))
    changed = 0
    for _, cell, got in pairs:
        outputs = stored(got.get("outputs", []))
        changed += (cell.get("outputs", []), cell.get("execution_count")) != (outputs, got.get("execution_count"))
        cell["outputs"], cell["execution_count"] = outputs, got.get("execution_count")
    ref.get("metadata", {}).pop("widgets", None)
    reference.write_text(json.dumps(ref, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return changed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", nargs="?", type=Path, default=ROOT / "_build", help="the build folder (_build)")
    parser.add_argument("--refresh", action="store_true", help="copy the build's outputs into book/*.ipynb")
    parser.add_argument("--book", type=Path, default=ROOT / "book", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    problems, lines = [], []
    for reference in sorted(args.book.glob("[0-9][0-9]_*.ipynb")):
        executed = args.build / "jupyter_execute" / "book" / reference.name
        if not executed.is_file():
            problems.append(f"{reference.name}: no executed copy at {executed} (run the book build first)")
            continue
        if args.refresh:
            try:
                n = refresh(reference, executed)
                size = reference.stat().st_size
                lines.append(f"{reference.name}: {n} code cells' outputs refreshed (model: "
                             f"{', '.join(sorted(models(_read(executed)))) or 'none named'}), {size / 1e3:.0f} KB")
                if size > MAX_BYTES:
                    problems.append(f"{reference.name}: {size / 1e3:.0f} KB, over {MAX_BYTES / 1e3:.0f} KB: lighten "
                                    "its figures (fewer slider frames, a smaller figsize or dpi, a palette)")
            except ValueError as exc:
                problems.append(str(exc))
            continue
        ref, new = _read(reference), _read(executed)
        if models(ref) != models(new):
            lines.append(f"{reference.name}: built on {', '.join(sorted(models(new))) or '?'}, stored outputs "
                         f"from {', '.join(sorted(models(ref))) or '?'}: only the checked cells compared")
        problems += compare(reference, executed)
    if lines or problems:
        print("\n".join(lines + problems))
    if problems:
        return 1
    print("check_outputs: the build's outputs are in book/*.ipynb" if args.refresh
          else "check_outputs: every stored output equals the build's (values marked volatile masked)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
