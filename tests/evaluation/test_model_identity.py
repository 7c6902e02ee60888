"""A results folder is never another model's: fine-tuned models lie in folders
called ``hf``, so two of them with one MODEL_TYPE name the same eval folder
(and the same search folder), and a resumed run would report the first
model's episodes as the second's. The second run is refused in one line that
names both models and the fix, before it writes anything; the same model
resumes as before. A run whose model cannot load writes nothing at all."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.env_fixtures import ROOT
from tests.support.faults import script_env
from tests.support.model_fixtures import build_tiny_model
from tests.support.served_names import files_under


@pytest.fixture(scope="module")
def two_hf_models(tmp_path_factory) -> tuple[Path, Path]:
    """Two different tiny models, each in a folder called ``hf``, as a loop's fine-tunes lie."""
    root = tmp_path_factory.mktemp("models")
    return (Path(build_tiny_model(root / "run_a" / "hf", seed=1)),
            Path(build_tiny_model(root / "run_b" / "hf", seed=2)))


def script(cwd: Path, name: str, model: Path | str, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / name), *map(str, args)], cwd=cwd,
                          env=script_env({"TASK": "textcraft", "MODEL_DIR": str(model), "BACKEND": "hf", **env}),
                          capture_output=True, text=True, timeout=300)


def episodes(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.glob("search_results_*.json")}


def episodes_before(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in files.items() if name.startswith("search_results_")}


def test_a_second_model_of_the_same_folder_name_is_refused_and_the_first_resumes(tmp_path, two_hf_models,
                                                                                   textcraft_server):
    first, second = two_hf_models
    args = ("--env_server_base", textcraft_server, "--output_dir", tmp_path / "out", "--limit", 2, "--max_steps", 2)
    done = script(tmp_path, "eval.py", first, *args, MODEL_TYPE="iter1")
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = tmp_path / "out" / "textcraft" / "hf_iter1"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["model"]["sha256"] and manifest["model"]["path"].endswith("run_a/hf")
    before = {f: (run_dir / f).read_bytes() for f in files_under(run_dir)}

    other = script(tmp_path, "eval.py", second, *args, MODEL_TYPE="iter1")
    assert other.returncode == 2
    assert other.stderr.count("\n") == 1 and "Traceback" not in other.stderr
    assert "run_a/hf" in other.stderr and "run_b/hf" in other.stderr and "MODEL_NAME" in other.stderr
    assert {f: (run_dir / f).read_bytes() for f in files_under(run_dir)} == before   # nothing written

    again = script(tmp_path, "eval.py", first, *args, MODEL_TYPE="iter1")     # the same model resumes
    assert again.returncode == 0 and episodes(run_dir) == episodes_before(before)
    named = script(tmp_path, "eval.py", second, *args, MODEL_TYPE="iter1", MODEL_NAME="run_b")   # the fix
    assert named.returncode == 0 and (tmp_path / "out" / "textcraft" / "run_b_iter1" / "summary.json").exists()


def test_a_folder_from_before_manifests_named_the_model_is_judged_by_its_summary(tmp_path, two_hf_models,
                                                                                  textcraft_server):
    """Folders written by earlier versions name the model only by the
    summary's weights sha256: that is enough to refuse another model."""
    first, second = two_hf_models
    args = ("--env_server_base", textcraft_server, "--output_dir", tmp_path / "out", "--limit", 1, "--max_steps", 2)
    assert script(tmp_path, "eval.py", first, *args).returncode == 0
    run_dir = tmp_path / "out" / "textcraft" / "hf_eval"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    del manifest["model"]
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    other = script(tmp_path, "eval.py", second, *args)
    assert other.returncode == 2 and "run_b/hf" in other.stderr


def test_a_search_folder_of_another_model_is_refused(tmp_path, two_hf_models, textcraft_server):
    first, second = two_hf_models
    args = ("--env_server_base", textcraft_server, "--output_dir", tmp_path / "trees", "--min", 1, "--max", 2,
            "--max_new_tokens", 12)
    small = {"ITERA": "1", "N_GEN": "2", "MAX_DEPTH": "2"}
    done = script(tmp_path, "mcts_collection.py", first, *args, **small)
    assert done.returncode == 0, done.stderr[-2000:]
    folder = tmp_path / "trees" / "textcraft" / "hf"
    trees = sorted(p.name for p in folder.glob("search_results_*.json"))
    assert trees
    other = script(tmp_path, "mcts_collection.py", second, *args, **small)
    assert other.returncode == 2 and "run_a/hf" in other.stderr and "trees" in other.stderr
    assert sorted(p.name for p in folder.glob("search_results_*.json")) == trees


@pytest.mark.parametrize("problem", ["missing model", "vllm absent"])
def test_a_model_that_cannot_load_leaves_no_output_folder(tmp_path, problem, textcraft_server):
    if problem == "vllm absent":
        pytest.importorskip("transformers")
        if __import__("importlib.util").util.find_spec("vllm") is not None:
            pytest.skip("vllm is installed in this environment: the case is a machine without it")
        model, env = ROOT / "models" / "textcraft-tiny", {"BACKEND": "vllm"}
    else:
        model, env = tmp_path / "no_such_model", {}
    res = script(tmp_path, "eval.py", model, "--env_server_base", textcraft_server, "--output_dir", tmp_path / "out",
                 "--limit", 1, **env)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert ("does not exist" in res.stderr) if problem == "missing model" else ("vllm" in res.stderr)
    assert not (tmp_path / "out").exists()


def test_identities_compare_by_weights_first_then_by_folder():
    from agent_r.model_identity import same_model

    assert same_model({"sha256": "a", "path": "x"}, {"sha256": "a", "path": "y"})   # a copied model
    assert not same_model({"sha256": "a", "path": "x"}, {"sha256": "b", "path": "x"})   # retrained in place
    assert not same_model({"sha256": None, "path": "x"}, {"sha256": None, "path": "y"})
    assert same_model({"name": "gpt"}, {"name": "gpt"})   # served models: the folder name already tells them apart


def test_the_copied_model_keeps_its_folder(tmp_path, two_hf_models, textcraft_server):
    """The same weights copied elsewhere are the same model: the folder resumes."""
    first, _ = two_hf_models
    copy = tmp_path / "moved" / "hf"
    shutil.copytree(first, copy)
    args = ("--env_server_base", textcraft_server, "--output_dir", tmp_path / "out", "--limit", 1, "--max_steps", 2)
    assert script(tmp_path, "eval.py", first, *args).returncode == 0
    run_dir = tmp_path / "out" / "textcraft" / "hf_eval"
    before = episodes(run_dir)
    again = script(tmp_path, "eval.py", copy, *args)
    assert again.returncode == 0 and episodes(run_dir) == before and len(before) == 1
