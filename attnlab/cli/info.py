"""`attnlab info`: versions, which models load (and why not), the data directory, corpora + sha256; `--settings`:
the ATTNLAB_* variables."""
from __future__ import annotations

import os
import platform
import sys

from attnlab.cli.options import quiet_arg
from attnlab.core import settings


def add_cli(sub) -> None:
    p = sub.add_parser("info", help="versions, models that load (and why not), data directory, corpora")
    p.add_argument("--model", default=None,
                   help="describe this model (any name --model takes elsewhere: smollm2, a .gguf file, a folder): its "
                        "licence, layer kinds and, for a causal language model, its perplexity on the "
                        "WikiText-2 test split and War and Peace")
    p.add_argument("--device", default="cpu", help="cpu or cuda (with --model)")
    p.add_argument("--settings", action="store_true",
                   help="every ATTNLAB_* environment variable: its value here, default and meaning")
    quiet_arg(p)
    p.set_defaults(func=run_info)


def print_settings() -> int:
    """`attnlab info --settings`: one line per ATTNLAB_* variable (`core.settings`), its value here ("-": unset),
    default and meaning, in aligned columns; a reader that stops early (`| head`) is no error."""
    rows = [("variable", "value", "default", "meaning")]
    rows += [(s.name, "-" if s.raw() is None else s.raw() or '""', s.shown_default, s.meaning) for s in settings.ALL]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3] for row in rows]
    try:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:          # stdout's reader is gone: send what is left nowhere, exit quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


PERPLEXITY_CORPORA = (("wikitext2", "the WikiText-2 test split"), ("war_and_peace", "War and Peace"))


def describe_model(name: str, device: str) -> int:
    """`attnlab info --model M`: what the model is, its licence, its checksum, its layer kinds, and a causal model's
    perplexity on both corpora."""
    from attnlab.core import models

    m = models.load_model(name, device)
    kind = "causal" if m.causal else "bidirectional"
    print(f"model         {m.name}: {m.n_layers} layers x {m.n_heads} heads x {m.d_head}, {kind}, "
          f"{m.max_positions} positions")
    print(f"source        {m.source}")
    if m.note:
        print(f"note          {m.note}")
    licence = licence_line(name)
    if licence:
        print(f"licence       {licence}")
    print(f"weights       sha256 {m.weights_sha256}")
    print(f"identity      {m.identity} (weights, the files that shape its numbers, config and tokenizer as loaded)")
    for name, sha in m.files.items():
        print(f"  file        {name}  sha256 {sha}")
    for check in m.checks:
        print(f"  checked     {check}")
    print(f"layers        {kinds_line(m.layer_kinds)}")
    if m.causal and not m.random_weights:
        print_perplexities(m)
    return 0


def licence_line(name: str) -> str:
    """A named model's licence and where its text is: the installed file where the table names one, else the
    table's words ("" for a model outside the table)."""
    from attnlab.core import gguf, model_table

    e = model_table.entry(name)
    if e is None:
        return ""
    path = gguf.licence_path(e)
    if path is not None:
        return f"{e.licence}: {path}"
    return f"{e.licence} ({e.licence_text})" if e.licence_text else e.licence


def kinds_line(kinds) -> str:
    """The layer kinds ((kind, window) per layer) in words: "15 sliding (window 512): 0-4, 6-10, 12-16; 3 full: 5,
    11, 17"."""
    groups: dict[tuple, list[int]] = {}
    for layer, kind in enumerate(kinds):
        groups.setdefault(kind, []).append(layer)
    parts = []
    for (kind, window), layers in groups.items():
        runs, start = [], layers[0]
        for a, b in zip(layers, layers[1:] + [None]):
            if b != a + 1:
                runs.append(f"{start}-{a}" if a > start else f"{a}")
                start = b
        parts.append(f"{len(layers)} {kind}" + (f" (window {window})" if window else "") + ": " + ", ".join(runs))
    return "; ".join(parts)


def print_perplexities(m) -> None:
    """The model's perplexity on each of PERPLEXITY_CORPORA (strided, from the results cache when there)."""
    from attnlab.core import text
    from attnlab.core.perplexity import cached_perplexity

    for corpus, words in PERPLEXITY_CORPORA:
        r = cached_perplexity(m, text.load_corpus(corpus, allow_download=False))
        row = r.rows[0]
        print(f"perplexity    {row['perplexity']:.2f} on the first {row['tokens']} tokens of {words} (windows of "
              f"{row['window']} tokens{', each BOS first' if r.provenance.get('bos_first') else ''}, "
              f"stride {row['stride']}"
              + (", from the results cache)" if r.provenance.get("loaded_from_cache") else ")"))


def run_info(args) -> int:
    import torch
    import transformers

    from attnlab.core.util import check_device

    if args.settings:
        return print_settings()
    check_device(args.device)
    if args.model is not None:
        return describe_model(args.model, args.device)
    import attnlab
    from attnlab.core import model_table, models, text

    print(f"python        {platform.python_version()}")
    print(f"torch         {torch.__version__} (cuda available: {torch.cuda.is_available()})")
    print(f"transformers  {transformers.__version__}")
    print(f"attnlab       {attnlab.__version__}")
    print(f"data dir      {text.data_dir() or '(not set: ' + text.DATA_ENV + ')'}")
    print(f"cache dir     {text.cache_dir()}")
    print(f"hub reachable {models.hub_reachable()}")
    print("models:")
    for e in model_table.MODELS:
        name = e.name
        if not e.in_info:
            continue
        try:
            m = models.load_model(name)
            sha = f", sha256 {m.weights_sha256} (verified)" if e.sha256 else (
                f", sha256 {m.weights_sha256}" if m.weights_sha256 else "")
            print(f"  {name:10s} ok: {m.n_layers}x{m.n_heads} heads, {m.max_positions} positions, {m.source}{sha}")
        except Exception as exc:  # noqa: BLE001 - report every failure, keep going
            print(f"  {name:10s} unavailable: {exc}")
    print("corpora:")
    for name in text.CORPORA:
        try:
            c = text.load_corpus(name, allow_download=False)
            print(f"  {name:14s} {c.source}  sha256 {c.sha256} ({'verified' if c.verified else 'unknown file'})")
        except Exception as exc:  # noqa: BLE001
            print(f"  {name:14s} unavailable: {exc}")
    return 0
