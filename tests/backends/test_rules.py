"""Rules every backend follows, whatever runs the model: request seeds,
greedy gives one sample, and an endpoint that ignores the sampling settings
is named once."""
from __future__ import annotations

import logging
import subprocess
import sys

from agent_r.driver import generate_checked
from agent_r.llm import GenerationRequest, HFBackend, OpenAIBackend, derive_seed
from tests.backends.common import GREEDY_16, SAMPLED_16, crafting_chat, fake_serve
from tests.support.doubles import ScriptedBackend
from tests.support.env_fixtures import stop_server
from tests.support.model_fixtures import ROOT


# ----------------------------------------------------------------------------- request seeds

def test_derived_seed_is_stable_across_processes_and_31_bits():
    """A request seed depends on its parts only: the same in another process
    (unlike hash(), which is salted per process), fits 31 bits, and differs
    when any part differs."""
    code = "from agent_r.llm import derive_seed; print(derive_seed(0, 'textcraft', 3, 1))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123"}, cwd=ROOT)
    assert int(other.stdout) == derive_seed(0, "textcraft", 3, 1) == 1807693030
    assert 0 <= derive_seed("x") < 2**31
    assert len({derive_seed(0, "textcraft", 3, s) for s in range(50)}) == 50


# ----------------------------------------------------------------------------- TEMP=0 with N_GEN > 1

def test_greedy_gives_one_sample_on_hf_and_says_so_once(tiny_model_dir, caplog):
    """Greedy requests asking n > 1 get one sample, said once per backend;
    sampling still gives n."""
    hf = HFBackend(tiny_model_dir, device="cpu")   # its own: the note is once per backend
    with caplog.at_level(logging.INFO, logger="agent_r.llm"):
        out = hf.generate([GenerationRequest(crafting_chat(), n=4), GenerationRequest(crafting_chat("x"), n=3)],
                          GREEDY_16)
        hf.generate([GenerationRequest(crafting_chat(), n=4)], GREEDY_16)
    assert [len(o) for o in out] == [1, 1]
    notes = [r.getMessage() for r in caplog.records if "TEMP=0 is greedy" in r.getMessage()]
    assert len(notes) == 1 and "one sample per request (n=4 asked)" in notes[0]
    assert [len(o) for o in hf.generate([GenerationRequest(crafting_chat(), n=3)], SAMPLED_16)] == [3]


def test_generate_checked_applies_the_greedy_rule_to_user_backends():
    """A user's backend is sent n=1 for greedy requests by the checked call,
    so it need not know the rule; sampling still asks n."""
    double = ScriptedBackend(lambda messages, i, seed: f"Action: move {i}")
    assert generate_checked(double, [GenerationRequest(crafting_chat(), n=3)], GREEDY_16) == [["Action: move 0"]]
    assert double.batches[-1].requests[0].n == 1
    assert generate_checked(double, [GenerationRequest(crafting_chat(), n=3)], SAMPLED_16) == [
        ["Action: move 0", "Action: move 1", "Action: move 2"]]


def test_greedy_search_expands_one_child_per_node(textcraft_server):
    """A greedy MCTS asks one sample per expansion, so every node has at
    most one child and no sample is a dropped duplicate."""
    from agent_r import envs
    from agent_r.search import SearchSettings, search_trees

    spec = envs.get_env("textcraft")
    double = ScriptedBackend(lambda messages, i, seed: f"Thought: try {i}.\nAction: get {i + 1} oak log")
    roots = []
    search_trees([1], spec, lambda: spec.make_client(textcraft_server), double,
                 SearchSettings(n_gen=3, temperature=0.0, iterations=3, max_depth=3, concurrency=1),
                 on_tree=lambda outcome: roots.append((outcome.result, outcome.job.stats)))
    (root, stats), = roots
    assert stats.expansions >= 2 and stats.samples == stats.expansions and stats.duplicates == 0
    assert all(len(node.children) <= 1 for node in root.iter_nodes())
    assert {r.n for batch in double.batches for r in batch.requests} == {1}


# ----------------------------------------------------------------------------- duplicates

def test_endpoint_ignoring_sampling_is_named_once(caplog):
    """An endpoint answering the same reply for every sample at TEMP > 0
    (like `transformers serve`) is warned about once, naming the cause."""
    proc, url = fake_serve("--ignore-sampling")   # like `transformers serve`: one choice, same reply
    try:
        backend = OpenAIBackend("m", url, "EMPTY", max_retries=0)
        with caplog.at_level(logging.WARNING, logger="agent_r.llm"):
            for round_ in range(3):
                out = generate_checked(backend, [GenerationRequest(crafting_chat(str(i)), n=4, seed=i + round_)
                                                 for i in range(4)], SAMPLED_16)
    finally:
        stop_server(proc)
    assert all(len(set(o)) == 1 and len(o) == 4 for o in out)
    warned = [r.getMessage() for r in caplog.records if "exact copies" in r.getMessage()]
    assert len(warned) == 1
    assert "24 of 24 extra samples at TEMP=1" in warned[0] and "transformers serve" in warned[0]
    assert "ignore the sampling settings" in warned[0]


def test_no_duplicate_warning_for_real_sampling_or_greedy(hf, caplog):
    """Real sampling, and copies at greedy (one sample asked), never warn."""
    with caplog.at_level(logging.WARNING, logger="agent_r.llm"):
        generate_checked(hf, [GenerationRequest(crafting_chat(str(i)), n=4, seed=i) for i in range(8)], SAMPLED_16)
        copies = ScriptedBackend(lambda m, i, s: "Action: same")
        generate_checked(copies, [GenerationRequest(crafting_chat(str(i)), n=4) for i in range(8)], GREEDY_16)
    assert "exact copies" not in caplog.text
