"""`attnlab capture`: one model's exact attention on a text file, saved per head as safetensors (probabilities; q, k,
v with --qkv) with a small JSON of provenance (model, identity, text sha256, tokens)."""
from __future__ import annotations

import json
from pathlib import Path

from attnlab.cli.options import model_args, quiet_arg

DEFAULT_MAX_LENGTH = 512        # probabilities take layers x heads x L^2 floats: 512 keeps any small model in memory


def add_cli(sub) -> None:
    p = sub.add_parser("capture", help="save a model's attention probabilities on a text (and q, k, v) as safetensors",
                       description=__doc__.splitlines()[0].strip("`") + " " + " ".join(__doc__.splitlines()[1:]))
    model_args(p)
    p.add_argument("--text", required=True, help="UTF-8 text file")
    p.add_argument("--out", required=True, help="output folder: attention.safetensors and capture.json")
    p.add_argument("--layers", type=int, nargs="+", default=None, metavar="N", help="layers to keep (default all)")
    p.add_argument("--qkv", action="store_true", help="also save the queries, keys and values per head")
    p.add_argument("--max-length", type=int, default=DEFAULT_MAX_LENGTH, metavar="L",
                   help="the text's first L tokens at most (default %(default)s; up to the model's positions)")
    quiet_arg(p)
    p.set_defaults(func=run_capture)


def text_ids(model, text: str, max_length: int):
    """The window of `text` that `model` reads: its first min(max_length, positions, the text's tokens) tokens
    (encoders: [CLS] ... [SEP] around them; the model table's `bos`: BOS before them; as `core.text.window`)."""
    if max_length < 2:
        raise ValueError(f"--max-length must be at least 2, got {max_length}")
    special = not model.causal and getattr(model.tokenizer, "cls_token_id", None) is not None
    extra = 2 if special else 1 if getattr(model, "bos", False) else 0
    n = len(model.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]) + extra
    length = min(max_length, model.max_positions, n)
    if length < 2:
        raise ValueError(f"the text holds {n} token(s) for {model.name}: pass a text of at least 2 tokens")
    return model.window(text, length)


def save_capture(trace, out: Path, provenance: dict) -> dict[str, Path]:
    """attention.safetensors (`probs` [layer, head, query, key]; `q`, `k`, `v` [layer, head, token, d_head] where
    captured; `token_ids`) and capture.json (provenance, layers, heads, tensors and their shapes) in `out`."""
    from safetensors.torch import save_file

    tensors = {name: getattr(trace, name).contiguous() for name in ("probs", "q", "k", "v")
               if getattr(trace, name) is not None}
    tensors["token_ids"] = trace.token_ids.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    paths = {"tensors": out / "attention.safetensors", "provenance": out / "capture.json"}
    save_file(tensors, str(paths["tensors"]), metadata={"model": trace.model_name})
    info = {**provenance, "layers": trace.layers, "heads": trace.heads, "causal": trace.causal,
            "scaling": trace.scaling, "tokens": int(trace.token_ids.numel()),
            "tensors": {k: list(v.shape) for k, v in tensors.items()}}
    paths["provenance"].write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return paths


def run_capture(args) -> int:
    from attnlab import __version__
    from attnlab.core.models import load_model
    from attnlab.core.text import read_text_file
    from attnlab.core.util import writable_dir

    text, text_info = read_text_file(args.text)          # a missing file: one line, before the model loads
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out!r} exists and is not a directory: choose another path")
    writable_dir(out if out.exists() else out.parent)
    model = load_model(args.model, args.device)
    ids = text_ids(model, text, args.max_length)
    keep = ("probs", "q", "k", "v") if args.qkv else ("probs",)
    trace = model.capture(ids, layers=args.layers, keep=keep, text_sha256=text_info["text_sha256"])
    prov = {"attnlab": __version__, "model": model.name, "model_identity": model.identity,
            "model_source": model.source, "model_weights_sha256": model.weights_sha256, **text_info,
            "token_ids": trace.token_ids.tolist(),
            "token_strings": model.tokenizer.convert_ids_to_tokens(trace.token_ids.tolist())}
    paths = save_capture(trace, out, prov)
    print(f"captured {model.name} on {text_info['text']} ({trace.token_ids.numel()} tokens, {len(trace.layers)} "
          f"layers x {len(trace.heads)} heads): {paths['tensors']}, {paths['provenance']}")
    return 0
