"""Reading model files safely, before any model exists: the hub's reachability, file checksums, refusing a
directory's own code, quiet transformers loads, the tokenizer checks (GPT-2's BPE from its files; any
tokenizer against its model's vocabulary and a round trip), and a model's identity: the files and loaded
objects that shape its numbers (`shaping_files`, `config_digest`, `tokenizer_digest`). `core.models` and
`core.gguf` build on it."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Optional

GPT2_VOCAB_SIZE = 50257
# OpenAI's GPT-2 BPE files (identical to encoder.json / vocab.bpe), as in the shared data's SHA256SUMS
GPT2_TOKENIZER_SHA256 = {"vocab.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
                         "merges.txt": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}
GPT2_HELLO_WORLD = [15496, 995]


class ModelUnavailable(RuntimeError):
    """The requested model cannot be loaded here (offline without a local copy, missing package...)."""


class AttnlabWarning(UserWarning):
    """A warning of attnlab's own that the command line prints as one line, "attnlab: warning: ..." (`cli.main`);
    Python shows it as any UserWarning elsewhere."""


def hub_reachable(timeout: float = 3.0) -> bool:
    """True if the Hugging Face hub answers an HTTPS request within `timeout` s (any HTTP status counts;
    a proxy that accepts TCP but fails TLS does not). Never minutes of retries."""
    import urllib.error
    import urllib.request

    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    url = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True                         # the hub answered (with an error status): it is reachable
    except (urllib.error.URLError, OSError, ValueError):
        return False


MAX_JSON_BYTES = 256 << 20          # a model folder's *.json (a large vocabulary's tokenizer.json is tens of MiB)
# the files of a model folder that shape its numbers and that transformers opens itself: each must be a regular file
NUMBER_SHAPING = ("*.json", "*.safetensors", "*.gguf", "*.bin", "*.model", "merges.txt", "vocab.txt")


def check_model_folder(directory: Path) -> None:
    """Raise ModelUnavailable (one line) when a file of a model folder that shapes its numbers (NUMBER_SHAPING:
    config, tokenizer files, weights, every *.json) is not a regular file (a FIFO would hang transformers' open,
    a link to /dev/zero would never end) or a *.json is larger than MAX_JSON_BYTES. Checked before any loader
    opens the folder (`refuse_code`, `core.gguf.find_gguf`)."""
    from attnlab.core.util import regular_file

    for pattern in NUMBER_SHAPING:
        for path in sorted(Path(directory).glob(pattern)):
            regular_file(path, "model file", limit=MAX_JSON_BYTES if path.suffix == ".json" else None,
                         error=ModelUnavailable, fix="a model folder holds regular files only; remove or replace it")


def refuse_code(directory: Path) -> None:
    """Raise ModelUnavailable when a model directory asks to run code of its own: an `auto_map` in any
    of its JSON files (config.json, tokenizer_config.json, processor files...), or holds a number-shaping file
    that is not a regular file (`check_model_folder`). Checked before any loader reads the directory; every
    loader also passes trust_remote_code=False, so transformers never asks on stdin whether to run it (a piped
    "y" would answer that question)."""
    from attnlab.core.util import read_regular

    directory = Path(directory)
    if not directory.is_dir():
        return
    check_model_folder(directory)
    for path in sorted(directory.glob("*.json")):
        text = read_regular(path, "model file", limit=MAX_JSON_BYTES, error=ModelUnavailable).decode(errors="replace")
        if '"auto_map"' in text:
            raise ModelUnavailable(f"{path} names code of its own (auto_map): attnlab never runs a model "
                                   "directory's code; use a directory without auto_map")


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a regular file, read in 1 MiB blocks (`util.open_regular`: never a FIFO or a device;
    ModelUnavailable names it)."""
    from attnlab.core.util import open_regular

    h = hashlib.sha256()
    with open_regular(path, "model file", error=ModelUnavailable) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_gpt2_tokenizer(tok) -> None:
    """Raise unless `tok` is the real GPT-2 BPE (offline, transformers can silently return a broken one)."""
    size = len(tok)
    ids = tok("Hello world", add_special_tokens=False)["input_ids"]
    if size != GPT2_VOCAB_SIZE or list(ids) != GPT2_HELLO_WORLD:
        raise ModelUnavailable(
            f"broken GPT-2 tokenizer ({size} tokens, 'Hello world' -> {list(ids)}; expected "
            f"{GPT2_VOCAB_SIZE} tokens and {GPT2_HELLO_WORLD}). Offline? Set ATTNLAB_DATA_DIR to a directory "
            "holding gpt2-tokenizer/vocab.json and merges.txt.")


def gpt2_tokenizer_from_files(directory: Path):
    """GPT-2 tokenizer from vocab.json + merges.txt (note: `vocab_file=` is silently ignored; use `vocab=`)."""
    from transformers import GPT2TokenizerFast

    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        raise ModelUnavailable(f"no vocab.json + merges.txt in {directory}")
    for path in (vocab, merges):       # a shortened merges.txt passes the token checks but changes every window
        if file_sha256(path) != GPT2_TOKENIZER_SHA256[path.name]:
            raise ModelUnavailable(f"{path} is not OpenAI's GPT-2 {path.name} (sha256 {file_sha256(path)[:12]}..., "
                                   f"expected {GPT2_TOKENIZER_SHA256[path.name][:12]}...): restore the file")
    tok = GPT2TokenizerFast(vocab=str(vocab), merges=str(merges))
    check_gpt2_tokenizer(tok)
    return tok


def gpt2_tokenizer(source: Optional[str] = None):
    """The GPT-2 tokenizer: from `source` (hub id / dir) if it works, else ATTNLAB_DATA_DIR/gpt2-tokenizer."""
    from attnlab.core.text import data_dir

    errors = []
    if source is not None:
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(source, local_files_only=not hub_reachable(), trust_remote_code=False)
            check_gpt2_tokenizer(tok)
            return tok
        except Exception as exc:  # noqa: BLE001 - fall through to the local files, report all
            errors.append(f"{source}: {exc}")
    if data_dir() is not None:
        try:
            return gpt2_tokenizer_from_files(data_dir() / "gpt2-tokenizer")
        except ModelUnavailable as exc:
            errors.append(str(exc))
    raise ModelUnavailable("no working GPT-2 tokenizer: " + "; ".join(errors or ["set ATTNLAB_DATA_DIR"]))


PROBE_SENTENCE = "The quick brown fox jumps over the lazy dog."


# A probe that every tokenizer must give back (`round_trip`): capitals, digits, punctuation, a run of spaces,
# a line break, accents, quotes, CJK and a superscript.
ROUND_TRIP_PROBE = "The quick brown fox, aged 42, jumps over the lazy dog.\nCafé — naïve  «quotes» 日本語 x²"


def round_trip(tok) -> str:
    """How `tok` gives back ROUND_TRIP_PROBE: "exact" (decode(encode(probe)) == probe), or "same words after its
    normalizer" (an uncased WordPiece lowercases, strips accents and spaces punctuation: the words must still be
    the normalized probe's). Raise ModelUnavailable otherwise (a tokenizer that drops spaces, maps bytes wrong...).
    A consistent permutation of ids passes a round trip: only a checksum catches that (`check_files`)."""
    ids = list(tok(ROUND_TRIP_PROBE, add_special_tokens=False)["input_ids"])
    back = tok.decode(ids, skip_special_tokens=True)
    if back == ROUND_TRIP_PROBE:
        return "exact"
    normalizer = getattr(getattr(tok, "backend_tokenizer", None), "normalizer", None)
    expected = normalizer.normalize_str(ROUND_TRIP_PROBE) if normalizer is not None else ROUND_TRIP_PROBE
    if re.findall(r"\w+", back) == re.findall(r"\w+", expected):
        return "same words after its normalizer"
    raise ModelUnavailable(f"the tokenizer does not give its text back: {ROUND_TRIP_PROBE[:40]!r}... -> "
                           f"{back[:40]!r}...: its files are damaged or not this model's")


# Files of a model folder that shape its numbers: weights, config, tokenizer (not generation settings, chat
# templates, READMEs or a sentence-transformers pooling config, which attnlab never reads).
SHAPING_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt", "vocab.json",
                 "merges.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


def shaping_files(folder: Path) -> dict[str, str]:
    """{file name: sha256} of the files of `folder` that shape a model's numbers (SHAPING_FILES, plus weight
    shards *.safetensors), in name order."""
    folder = Path(folder)
    names = set(SHAPING_FILES) | {p.name for p in folder.glob("*.safetensors")}
    return {name: file_sha256(folder / name) for name in sorted(names) if (folder / name).is_file()}


def check_files(folder: Path, expected: dict[str, str], what: str) -> dict[str, str]:
    """`shaping_files(folder)`, after checking that each file named in `expected` is there with that sha256
    (raise ModelUnavailable naming the first that is not)."""
    found = shaping_files(folder)
    for name, sha in expected.items():
        if found.get(name) != sha:
            state = "is missing" if name not in found else f"has sha256 {found[name][:12]}..., not {sha[:12]}..."
            raise ModelUnavailable(f"{Path(folder) / name} {state}: not {what}'s file; reinstall it")
    return found


def not_published_with(files: dict[str, str], published: dict[str, dict[str, str]]) -> Optional[tuple[str, list]]:
    """(model, [file names]) when the weights among `files` ({name: sha256}, `shaping_files`) are those of a
    model in `published` ({model: {file name: sha256}}, its weights *.safetensors among them): the folder's
    other number-shaping files that are not the ones published with those weights (another sha256, or a file the
    model was not published with; a missing one is not counted: the others stand in for it). None when the
    weights are no known model's."""
    for model, expected in published.items():
        weights = [name for name in expected if name.endswith(".safetensors")]
        if weights and all(files.get(name) == expected[name] for name in weights):
            return model, [name for name in sorted(files) if name not in weights and files[name] != expected.get(name)]
    return None


def published_with_line(folder: Path, model: str, names: list, expected: dict[str, str], found: dict[str, str]) -> str:
    """The one warning for a folder holding `model`'s weights beside files (`names`) not published with them."""
    def one(name):
        return (f"{name} (sha256 {found[name][:12]}..., published {expected[name][:12]}...)" if name in expected
                else f"{name} (not among its published files)")

    parts = list(dict.fromkeys("the config" if n == "config.json" else "the tokenizer" for n in names))
    kinds, plural = " and ".join(parts), len(parts) > 1
    return (f"{folder}: {', '.join(one(n) for n in names)} {'are' if len(names) > 1 else 'is'} not {model}'s: "
            f"{kinds} {'are' if plural else 'is'} not the one{'s' if plural else ''} the weights ({model}'s, by "
            f"sha256) were published with; the numbers are this folder's, not {model}'s")


_VOLATILE_CONFIG = ("transformers_version", "dtype", "torch_dtype", "attn_implementation")


def config_digest(config) -> str:
    """sha256 of a loaded transformers config as it shapes numbers: its dict, sorted, without where it was read
    from, the transformers version, the load dtype and the attention implementation (keys `_...`)."""
    plain = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k not in _VOLATILE_CONFIG}
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()


def tokenizer_digest(tok) -> str:
    """sha256 of what a tokenizer does: a fast tokenizer's full state (vocabulary, merges, normalizer,
    pre-tokenizer, post-processor, added tokens; not its current truncation and padding, which calls change),
    else its sorted vocabulary; with its class and special token ids. A fast tokenizer's digest is kept in the cache
    folder under a hash of its serialized state (`_digest_memo`): the same digest, without the 2 s of Gemma 3's."""
    backend = getattr(tok, "backend_tokenizer", None)
    special = {name: getattr(tok, f"{name}_token_id", None) for name in ("bos", "eos", "unk", "sep", "cls", "pad")}
    if backend is None:
        return _state_digest(type(tok).__name__, special, sorted(tok.get_vocab().items()))
    raw = backend.to_str()
    memo = _digest_memo(hashlib.sha256(json.dumps([type(tok).__name__, special], sort_keys=True).encode()
                                       + b"\n" + raw.encode()).hexdigest())
    if memo is not None and memo.is_file():
        known = memo.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{64}", known):
            return known
    state = json.loads(raw)
    state.pop("truncation", None)
    state.pop("padding", None)
    digest = _state_digest(type(tok).__name__, special, state)
    if memo is not None:
        with contextlib.suppress(OSError):
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(digest)
            tmp.replace(memo)
    return digest


def _state_digest(name: str, special: dict, state) -> str:
    text = json.dumps([name, special, state], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _digest_memo(key: str) -> Optional[Path]:
    """Where `tokenizer_digest` keeps the digest of a fast tokenizer's serialized state (`key`: sha256 of its class,
    special ids and `to_str()`): Gemma 3's 262,144-word state took 2 s to canonicalize at each load. None without a
    cache folder."""
    from attnlab.core.text import cache_dir

    try:
        return Path(cache_dir()) / "tokenizer-digests" / key
    except (OSError, ValueError):
        return None


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's whole message on one line (a validation error's detail is on its later lines)."""
    return (" ".join(str(exc).split()) or type(exc).__name__)[:limit]


def check_finite(hf, source) -> None:
    """Raise ModelUnavailable, naming the first tensor, when a model's weights hold NaN or inf."""
    bad = next((n for n, p in hf.named_parameters() if not bool(p.isfinite().all())), None)
    if bad is not None:
        raise ModelUnavailable(f"{source}: the weights hold NaN or inf (tensor {bad}): the file is corrupt, restore it")


def check_tokenizer(tok, hf, source: str) -> None:
    """Raise ModelUnavailable unless `tok` fits the model `hf`: at least half of the model's vocabulary,
    ids inside it, and PROBE_SENTENCE without unknown tokens. A folder without tokenizer files gets a
    stand-in from transformers (5 tokens: every word [UNK]) whose numbers would look like any others."""
    vocab = int(getattr(hf.config, "vocab_size", 0) or 0)
    try:
        ids = list(tok(PROBE_SENTENCE, add_special_tokens=False)["input_ids"])
    except Exception as exc:  # noqa: BLE001 - a tokenizer that cannot encode a sentence: one line
        raise ModelUnavailable(f"{source}: the tokenizer cannot encode a plain sentence ({one_line(exc, 160)}): its "
                               "files are damaged or not this model's") from None
    unknown = sum(i == tok.unk_token_id for i in ids) if tok.unk_token_id is not None else 0
    if len(tok) < vocab // 2 or not ids or unknown or max(ids) >= vocab > 0:
        raise ModelUnavailable(
            f"{source}: the tokenizer does not fit the model ({len(tok)} tokens for a vocabulary of {vocab}; "
            f"{PROBE_SENTENCE!r} -> {len(ids)} tokens, {unknown} unknown): put the model's tokenizer files "
            "(tokenizer.json, or its vocabulary files) beside config.json")


def weights_label(model_info: Optional[dict]) -> str:
    """' (4-bit weights)' / ' (random weights)' / '' from a model's provenance (`AttnModel.provenance`): what goes
    after its name wherever one of its numbers is shown."""
    info = model_info or {}
    if "4-bit" in str(info.get("model_note") or ""):
        return " (4-bit weights)"
    return " (random weights)" if info.get("model_random_weights") else ""


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' load reports and progress bars (errors still raise)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        hf_logging.enable_progress_bar()
