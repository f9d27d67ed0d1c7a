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

The same code on another class of CPU (ATen's capability: AVX512 on one machine, AVX2 on another) sums float32
in another order, and the few ill-conditioned numbers a chapter prints (a Jacobian norm at T = 1e-3, the smallest
gap between two logits, an exercise's answer to its last digit) move in their last digits. A committed chapter
records the class and the package (`_package_digest`) its outputs were made with (metadata "attnlab"); on a build
of another class, a cell may instead equal that class's variant, tests/outputs/NAME.<class>.json: the cells whose
outputs differed there, each with a digest of the committed outputs it stands beside (`of`: a variant of outputs
since refreshed no longer counts). `--cpu-variant` writes it, and only for a build of the same package whose
differences are numbers alone; a difference that comes with a change of code is a refresh.

    python scripts/check_outputs.py [_build]                 # exit 1 and a diff on any difference
    python scripts/check_outputs.py --refresh [_build]       # copy the build's outputs into book/*.ipynb
    python scripts/check_outputs.py --cpu-variant [_build]   # this CPU class's last digits, tests/outputs/
"""
from __future__ import annotations

import argparse
import hashlib
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
#: the committed chapter's metadata key: {"outputs_cpu": the CPU class, "outputs_package": `_package_digest`}
META = "attnlab"
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
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


def digest(outputs: list[dict]) -> str:
    """Short sha256 of normalized outputs (a variant's `of`)."""
    return hashlib.sha256(json.dumps(outputs, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def numbers_only(a: list[dict], b: list[dict]) -> bool:
    """Whether normalized outputs `a` and `b` differ in their numbers alone (every number read as '#')."""
    def shape(x):
        return NUMBER.sub("#", json.dumps(x, sort_keys=True, ensure_ascii=False))
    return shape(a) == shape(b)


def package_digest() -> str:
    """The digest of the package's code and libraries that keys the book's execution cache
    (scripts/attnlab_book.py `_package_digest`)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from attnlab_book import _package_digest

    return _package_digest(ROOT)


def made_with(nb: dict) -> dict:
    """What the committed chapter's outputs were made with: {"outputs_cpu", "outputs_package"} ({} if unrecorded)."""
    return nb.get("metadata", {}).get(META, {})


def variant_path(variants: Path, name: str, cpu: str) -> Path:
    return variants / f"{Path(name).stem}.{cpu.lower()}.json"


def read_variant(path: Path) -> dict:
    """{cell id: {"of": digest of the committed outputs, "outputs": this class's normalized outputs}} ({} if none)."""
    return json.loads(path.read_text(encoding="utf-8"))["cells"] if path.is_file() else {}


def write_variant(path: Path, name: str, cpu: str, cells: dict) -> None:
    """Write (or, with no cells, remove) a chapter's variant for CPU class `cpu`."""
    if not cells:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"notebook": name, "cpu": cpu, "cells": dict(sorted(cells.items()))}
    path.write_text(json.dumps(body, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


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


def _same(a, b) -> bool:
    """Normalized outputs equal once both have been through JSON (as a variant's have)."""
    return json.loads(json.dumps(a)) == json.loads(json.dumps(b))


def differing(reference: Path, executed: Path, variant: dict | None = None) -> tuple[list, list[str]]:
    """([(index, cell id, stored, executed)] of the compared cells whose normalized outputs differ, problems of
    pairing). Every code cell is compared when both ran the same model, else only the checked cells; a cell equal to
    its entry in `variant` (another CPU class's outputs of it, `read_variant`, whose `of` is the stored outputs'
    digest) counts as equal."""
    ref, new = _read(reference), _read(executed)
    every = models(ref) == models(new)
    pairs, problems = _pairs(ref, new, reference.name)
    found = []
    for i, cell, got in pairs:
        if not (every or checked(cell)):
            continue
        stored, executed_out = normalized(cell.get("outputs", [])), normalized(got.get("outputs", []))
        entry = (variant or {}).get(cell.get("id"))
        if stored != executed_out and not (entry and entry["of"] == digest(stored)
                                           and _same(entry["outputs"], executed_out)):
            found.append((i, cell.get("id"), stored, executed_out))
    return found, problems


def compare(reference: Path, executed: Path, variant: dict | None = None) -> list[str]:
    """Differences between the committed notebook and the build's executed copy (empty: equal), `differing`'s
    cells each as a diff."""
    found, problems = differing(reference, executed, variant)
    return problems + [f"{reference.name} cell {i} ({cid}):\n  stored:   {stored}\n  executed: {executed_out}"
                       for i, cid, stored, executed_out in found]


def refresh(reference: Path, executed: Path, cpu: str = "", package: str = "", variants: Path | None = None) -> int:
    """Copy the executed copy's outputs (those a committed chapter keeps: `stored`) and execution counts into the
    committed notebook (sources, metadata and markdown untouched; no widget state, as `make notebooks`), and record
    the CPU class and package they were made with. Returns the code cells whose outputs changed. Raises ValueError,
    writing nothing, when a code cell is missing there or has another source.

    With `variants`: this class's variant goes (its outputs are the committed ones now); another class's keeps the
    cells whose committed outputs did not change; and where the outputs were another class's and this class's
    variant stood for the new ones (its last digits alone), those outputs become that class's variant."""
    ref, new = _read(reference), _read(executed)
    pairs, problems = _pairs(ref, new, reference.name)
    if problems:
        raise ValueError("; ".join(problems))
    old_cpu = made_with(ref).get("outputs_cpu")
    own = read_variant(variant_path(variants, reference.name, cpu)) if variants and cpu else {}
    now, was_old = {}, {}                      # cell id -> digest of its new outputs; the old class's outputs kept
    changed = 0
    for _, cell, got in pairs:
        outputs = stored(got.get("outputs", []))
        before, after = normalized(cell.get("outputs", [])), normalized(outputs)
        entry = own.get(cell.get("id"))
        if old_cpu and old_cpu != cpu and before != after and entry and entry["of"] == digest(before) \
                and _same(entry["outputs"], after):
            was_old[cell.get("id")] = {"of": digest(after), "outputs": before}
        now[cell.get("id")] = digest(after)
        changed += (cell.get("outputs", []), cell.get("execution_count")) != (outputs, got.get("execution_count"))
        cell["outputs"], cell["execution_count"] = outputs, got.get("execution_count")
    ref.get("metadata", {}).pop("widgets", None)
    if cpu:
        ref.setdefault("metadata", {})[META] = {"outputs_cpu": cpu, "outputs_package": package}
    reference.write_text(json.dumps(ref, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    if variants and cpu:
        write_variant(variant_path(variants, reference.name, cpu), reference.name, cpu, {})
        for path in sorted(variants.glob(f"{reference.stem}.*.json")):
            other = json.loads(path.read_text(encoding="utf-8"))["cpu"]
            write_variant(path, reference.name, other, {k: v for k, v in read_variant(path).items()
                                                        if now.get(k) == v["of"]})
        if was_old:
            path = variant_path(variants, reference.name, old_cpu)
            write_variant(path, reference.name, old_cpu, read_variant(path) | was_old)
    return changed


def cpu_variant(reference: Path, executed: Path, cpu: str, package: str, variants: Path) -> tuple[int, list[str]]:
    """Record the build's outputs of the cells that differ from the committed ones as CPU class `cpu`'s variant
    (`write_variant`). Only for outputs made on another class with this package, the same model, and differences
    of numbers alone: anything else is a change, which a refresh records. Returns (cells recorded, problems)."""
    ref, new = _read(reference), _read(executed)
    made, name = made_with(ref), reference.name
    if not made:
        return 0, [f"{name}: no record of the CPU class its outputs were made on: refresh them (--refresh) first"]
    if made["outputs_cpu"] == cpu:
        return 0, [f"{name}: its outputs were made on this class of CPU ({cpu}): a difference here is a change, "
                   "not the CPU's (refresh them: --refresh)"]
    if made["outputs_package"] != package:
        return 0, [f"{name}: its outputs were made with package {made['outputs_package']} and this build is of "
                   f"{package}: a difference may be the code's, not the CPU's (refresh them: --refresh)"]
    if models(ref) != models(new):
        return 0, [f"{name}: built on another model than its outputs show"]
    found, problems = differing(reference, executed)
    problems += [f"{name} cell {i} ({cid}): its text differs, not only its numbers: a change, not the CPU's "
                 "(refresh: --refresh)" for i, cid, a, b in found if not numbers_only(a, b)]
    if problems:
        return 0, problems
    write_variant(variant_path(variants, name, cpu), name, cpu,
                  {cid: {"of": digest(a), "outputs": b} for _, cid, a, b in found})
    return len(found), []


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", nargs="?", type=Path, default=ROOT / "_build", help="the build folder (_build)")
    parser.add_argument("--refresh", action="store_true", help="copy the build's outputs into book/*.ipynb")
    parser.add_argument("--cpu-variant", action="store_true",
                        help="record this CPU class's last digits of the outputs (tests/outputs/NAME.<class>.json)")
    parser.add_argument("--book", type=Path, default=ROOT / "book", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", default="", help=argparse.SUPPRESS)           # tests: the class of this build
    parser.add_argument("--package", default="", help=argparse.SUPPRESS)       # tests: the package's digest
    args = parser.parse_args(argv)
    from attnlab.core.util import cpu_class

    cpu = args.cpu or cpu_class()
    package = args.package or (package_digest() if args.refresh or args.cpu_variant else "")   # (once, not per chapter)
    variants = args.book.parent / "tests" / "outputs"               # the per-class variants (NAME.<class>.json)
    problems, lines, other_cpu = [], [], set()
    for reference in sorted(args.book.glob("[0-9][0-9]_*.ipynb")):
        executed = args.build / "jupyter_execute" / "book" / reference.name
        if not executed.is_file():
            problems.append(f"{reference.name}: no executed copy at {executed} (run the book build first)")
            continue
        if args.refresh:
            try:
                n = refresh(reference, executed, cpu, package, variants)
                size = reference.stat().st_size
                lines.append(f"{reference.name}: {n} code cells' outputs refreshed (model: "
                             f"{', '.join(sorted(models(_read(executed)))) or 'none named'}; CPU {cpu}), "
                             f"{size / 1e3:.0f} KB")
                if size > MAX_BYTES:
                    problems.append(f"{reference.name}: {size / 1e3:.0f} KB, over {MAX_BYTES / 1e3:.0f} KB: lighten "
                                    "its figures (fewer slider frames, a smaller figsize or dpi, a palette)")
            except ValueError as exc:
                problems.append(str(exc))
            continue
        if args.cpu_variant:
            n, found = cpu_variant(reference, executed, cpu, package, variants)
            lines += [f"{reference.name}: {n} cells' outputs recorded as CPU {cpu}'s"] if n else []
            problems += found
            continue
        ref, new = _read(reference), _read(executed)
        if models(ref) != models(new):
            lines.append(f"{reference.name}: built on {', '.join(sorted(models(new))) or '?'}, stored outputs "
                         f"from {', '.join(sorted(models(ref))) or '?'}: only the checked cells compared")
        made = made_with(ref).get("outputs_cpu")
        variant = read_variant(variant_path(variants, reference.name, cpu)) if made and made != cpu else {}
        found = compare(reference, executed, variant)
        problems += found
        if found and made and made != cpu:
            other_cpu.add(made)
    if other_cpu:
        problems.append(f"The stored outputs were made on a CPU of class {', '.join(sorted(other_cpu))} and this one "
                        f"is {cpu}. Where only the last digits of ill-conditioned numbers differ and the package is "
                        "the one they were made with, `python scripts/check_outputs.py --cpu-variant _build` records "
                        "them as this class's (tests/outputs/); otherwise refresh them (`make refresh-outputs`).")
    if lines or problems:
        print("\n".join(lines + problems))
    if problems:
        return 1
    print("check_outputs: the build's outputs are in book/*.ipynb" if args.refresh else
          "check_outputs: this CPU class's outputs recorded" if args.cpu_variant else
          "check_outputs: every stored output equals the build's (values marked volatile masked)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
