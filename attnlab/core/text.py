"""Corpora: download + cache + sha256 for users online, or a local data directory (ATTNLAB_DATA_DIR)
laid out like the project's shared data; Gutenberg header/footer stripping; CRLF -> LF; token windows.
"""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from attnlab.core import settings

if TYPE_CHECKING:                  # torch is imported where used: `import attnlab` stays light (cli.main)
    import torch

DATA_ENV = settings.DATA_DIR.name
CACHE_ENV = settings.CACHE_DIR.name


@dataclass(frozen=True)
class CorpusSpec:
    name: str
    local: str                    # path inside the data directory
    url: str                      # canonical online source
    sha256: Optional[str]         # checksum of the known file (verified where the file is that one)
    start: Optional[str] = None   # the text proper starts at this line
    gutenberg: bool = False


CORPORA = {
    "war_and_peace": CorpusSpec(
        "war_and_peace", "war_and_peace.txt",
        "https://www.gutenberg.org/cache/epub/2600/pg2600.txt",
        "aa4a454fb73861c0c84c662ed1fa3ddd71bbd7a237783932c05d5f3b2cdd6718",
        start="BOOK ONE: 1805", gutenberg=True),
    "wikitext2": CorpusSpec(
        "wikitext2", "wikitext-2-raw/wiki.test.raw",
        "https://huggingface.co/datasets/Salesforce/wikitext/resolve/main/wikitext-2-raw-v1/"
        "test-00000-of-00001.parquet",
        "4f3e427e4aff23acff917a8a51aeae21bf12832256e26914c8fc250dcef4103c"),
}

#: the texts' names as a reader knows them (captions and figure titles; the provenance keeps the ids)
TITLES = {"war_and_peace": "War and Peace", "wikitext2": "WikiText-2"}


def text_title(name: str) -> str:
    """A text's name for a reader: "war_and_peace" -> "War and Peace"; an unknown name as it is."""
    return TITLES.get(name, name)


@dataclass(frozen=True)
class Corpus:
    """A cleaned text and where it came from. `sha256` is of the raw file as read."""

    name: str
    text: str
    sha256: str
    source: str
    verified: bool

    def provenance(self) -> dict:
        return {"text": self.name, "text_sha256": self.sha256, "text_source": self.source,
                "text_checksum_verified": self.verified, "line_endings": "LF (CRLF normalized)"}


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def data_dir() -> Optional[Path]:
    """The offline data directory named by ATTNLAB_DATA_DIR, or None."""
    return settings.get(DATA_ENV)


def cache_dir() -> Path:
    """attnlab's cache folder: ATTNLAB_CACHE_DIR, default the user's cache folder (~/.cache/attnlab on Linux)."""
    return settings.get(CACHE_ENV)


def normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_gutenberg(text: str, start: Optional[str] = None) -> str:
    """Cut the Project Gutenberg header and footer; with `start`, begin at that line (the novel proper)."""
    begin = text.find("*** START OF")
    if begin >= 0:
        text = text[text.index("\n", begin) + 1:]
    end = text.find("*** END OF")
    if end >= 0:
        text = text[:end]
    if start is not None:
        # the table of contents repeats the heading: the novel starts at its last occurrence
        # that is followed by a chapter heading
        at = [i for i in _find_all(text, start) if text[i:i + 200].find("CHAPTER I") >= 0]
        if not at:
            raise ValueError(f"start marker {start!r} not found: is this the right text?")
        text = text[at[-1]:]
    return text.strip() + "\n"


def _find_all(text: str, needle: str):
    i = text.find(needle)
    while i >= 0:
        yield i
        i = text.find(needle, i + 1)


#: seconds a download may wait for a byte (connecting, the answer, each read): a proxy that accepts the
#: connection and never answers costs this, not minutes
DOWNLOAD_TIMEOUT = 5.0
#: the largest text file read (bytes): a text, not a device or a disk image
MAX_TEXT_BYTES = 256 << 20


#: attempts per download (pooch, with a pause of a second between them): a dropped connection is tried again
DOWNLOAD_ATTEMPTS = 2


def _download(url: str, timeout: float = DOWNLOAD_TIMEOUT, attempts: int = DOWNLOAD_ATTEMPTS) -> bytes:
    """The bytes at `url`, fetched by pooch (atomic, no progress bar, no log lines) into a temporary folder; an
    OSError (requests' errors are OSErrors) after `attempts` tries."""
    import tempfile
    import time

    import pooch

    pooch.get_logger().setLevel("WARNING")
    downloader = pooch.HTTPDownloader(progressbar=False, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="attnlab-download-") as tmp:
        for attempt in range(attempts):
            try:
                path = pooch.retrieve(url, known_hash=None, fname=url.rsplit("/", 1)[-1] or "download", path=tmp,
                                      downloader=downloader)
                return Path(path).read_bytes()
            except OSError:
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0)
    raise OSError(f"no attempt to download {url}")


def _clean(spec: CorpusSpec, raw: bytes) -> str:
    text = normalize_newlines(raw.decode("utf-8-sig"))
    if spec.gutenberg:
        text = strip_gutenberg(text, spec.start)
    return text


def _parquet_text(data: bytes) -> bytes:
    """WikiText from the hub comes as parquet: join its lines, blank lines removed (like the shared file)."""
    try:
        import io

        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - online path only
        raise RuntimeError("reading WikiText from the hub needs `pip install pyarrow`; or set "
                           f"{DATA_ENV} to a directory holding wikitext-2-raw/wiki.test.raw") from exc
    lines = pq.read_table(io.BytesIO(data)).column("text").to_pylist()
    return "".join(line for line in lines if line.strip()).encode()


def load_corpus(name: str = "war_and_peace", *, allow_download: bool = True) -> Corpus:
    """Read a corpus: from ATTNLAB_DATA_DIR if set, else the cache, else download it (atomically).

    The checksum is verified when the file is the known one; a different release (e.g. an updated
    Gutenberg file) is used with a warning and its own sha256 recorded.
    """
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    spec = CORPORA[name]
    candidates = []
    if data_dir() is not None:
        if not data_dir().is_dir():
            raise FileNotFoundError(f"{DATA_ENV}={data_dir()} is not a folder: point it at the data folder "
                                    f"(holding {spec.local}), or unset it to download")
        candidates.append(data_dir() / spec.local)
    cached = cache_dir() / spec.local
    candidates.append(cached)
    from attnlab.core.util import read_regular

    for path in candidates:
        if path.exists():
            raw = read_regular(path, f"{name} corpus file", limit=MAX_TEXT_BYTES, fix="replace or delete it")
            return _corpus(spec, raw, str(path), strict=path != cached)
    if data_dir() is not None and not allow_download:
        raise FileNotFoundError(f"{spec.local} not found in {DATA_ENV}={data_dir()}")
    if not allow_download:
        raise FileNotFoundError(f"{name}: set {DATA_ENV} to a directory holding {spec.local}")
    try:
        raw = _download(spec.url)
    except OSError as exc:
        raise RuntimeError(f"could not download {name} from {spec.url} ({exc}). Offline? Set {DATA_ENV} "
                           f"to a directory holding {spec.local}.") from exc
    if spec.url.endswith(".parquet"):
        raw = _parquet_text(raw)
    from attnlab.core.util import atomic_write

    try:
        atomic_write(cached, raw)
    except OSError as exc:                       # the cache is an optimisation: use the text, say why once
        warnings.warn(f"attnlab cache: {cached} cannot be written ({exc.strerror or exc}); "
                      "downloading again next time", stacklevel=2)
    return _corpus(spec, raw, spec.url, strict=False)


def _corpus(spec: CorpusSpec, raw: bytes, source: str, strict: bool) -> Corpus:
    digest = sha256_bytes(raw)
    verified = digest == spec.sha256
    if not verified:
        msg = f"{spec.name}: sha256 {digest[:12]}... differs from the known file {str(spec.sha256)[:12]}... ({source})"
        if strict:
            raise ValueError(msg + ": the data directory file is corrupt or a different edition")
        warnings.warn(msg + "; using it and recording its checksum", stacklevel=3)
    return Corpus(spec.name, _clean(spec, raw), digest, source, verified)


def window(tokenizer, text: str, length: int, offset: int = 0, *, special_tokens: bool = False,
           bos: bool = False) -> torch.Tensor:
    """Token ids [length]: `length` consecutive tokens of `text` starting at token `offset`.

    With `special_tokens` (BERT-style encoders), the window is [CLS] + length-2 text tokens + [SEP]. With `bos`
    (`model_table`'s `bos`: Gemma 3), the tokenizer's BOS token + length-1 text tokens (a prefix of it is the window
    of the shorter length). Only a prefix of the text is tokenised (grown until long enough), so this is fast on a
    novel.
    """
    import torch

    if length < 2 or offset < 0:
        raise ValueError(f"need length >= 2 and offset >= 0, got length={length}, offset={offset}")
    if not text.strip():
        raise ValueError("the text is empty")
    if bos and (special_tokens or getattr(tokenizer, "bos_token_id", None) is None):
        raise ValueError("bos: a BOS token first needs a tokenizer with one, and no [CLS]/[SEP] window")
    body = length - 2 if special_tokens else length - 1 if bos else length
    need = offset + body
    chars = max(4096, need * 8)
    while True:
        ids = tokenizer(text[:chars], add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) > need or chars >= len(text):
            break
        chars *= 2
    if len(ids) < need:
        raise ValueError(f"the text has {len(ids)} tokens; offset {offset} + {body} tokens do not fit")
    ids = ids[offset:offset + body]
    if special_tokens:
        ids = [tokenizer.cls_token_id] + ids + [tokenizer.sep_token_id]
    if bos:
        ids = [tokenizer.bos_token_id] + ids
    return torch.tensor(ids, dtype=torch.long)


WINDOW_RULE = ("every length L is read as the model reads a window of L tokens: causal models the first L tokens; "
               "BERT-style encoders [CLS] + the first L - 2 text tokens + [SEP]")


def window_prefix(ids: "torch.Tensor", length: int, sep_id: Optional[int] = None) -> "torch.Tensor":
    """The window of `length` positions cut from a longer window `ids` [token] by WINDOW_RULE: ids[:length]; when
    `ids` ends with `sep_id` (an encoder's [SEP]), the first length - 1 positions and that [SEP], as `window`
    builds a window of `length` tokens."""
    import torch

    if not 2 <= length <= len(ids):
        raise ValueError(f"length must be in [2, {len(ids)}] for this window, got {length}")
    if sep_id is None or length == len(ids) or int(ids[-1]) != sep_id:
        return ids[:length]
    return torch.cat([ids[:length - 1], ids[-1:]])


def text_provenance(text: str, name: str = "text", **extra) -> dict:
    """Provenance of a text given as a string: sha256 of its UTF-8 bytes, length."""
    return {"text": name, "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "text_chars": len(text), **extra}


def resolve_text(text=None) -> tuple[str, dict]:
    """(text, provenance) from None (War and Peace, via ATTNLAB_DATA_DIR or the cache), a
    `attnlab.core.text.Corpus`, or a string."""
    if text is None:
        text = load_corpus("war_and_peace")
    if isinstance(text, Corpus):
        return text.text, text.provenance()
    if isinstance(text, str):
        if not text.strip():
            raise ValueError("the text is empty: pass a text with at least as many tokens as the longest L")
        return text, text_provenance(text)
    raise ValueError(f"text must be None, a Corpus or a string, got {type(text).__name__}")


def read_text_file(path) -> tuple[str, dict]:
    """(text, provenance) of a UTF-8 text file (CRLF -> LF) of at most MAX_TEXT_BYTES: a regular file, never a
    device or a FIFO (`util.read_regular`: checked before opening it). ValueError says what to do."""
    from attnlab.core.util import read_regular

    if not str(path).strip():
        raise ValueError("--text '' names no file: pass a UTF-8 text file (leave --text out for War and Peace)")
    p = Path(path).expanduser()
    raw = read_regular(p, "text file", limit=MAX_TEXT_BYTES, fix="pass a readable UTF-8 text file")
    try:
        text = normalize_newlines(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"text file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}): "
                         "convert it to UTF-8") from exc
    if "\x00" in text:
        raise ValueError(f"text file {str(path)!r} is not text (it holds NUL bytes): pass a UTF-8 text file")
    if not text.strip():
        raise ValueError(f"text file {str(path)!r} is empty: pass a text with at least as many tokens as the longest L")
    return text, {"text": p.name, "text_sha256": hashlib.sha256(raw).hexdigest(), "text_source": f"file {p.name}",
                  "text_chars": len(text), "line_endings": "LF (CRLF normalized)"}

