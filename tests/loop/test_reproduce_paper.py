"""reproduction/reproduce_paper.sh searches iteration 1 with mcts_collection.py
(shards beside the base eval, then one process for what they left) into the
folder iterate.py's search stage reads, with the loop's search settings; were
it another folder, every variant would silently search all trees again."""
from __future__ import annotations

import json
import shlex

import pytest

from agent_r.loop import IterateSettings
from agent_r.paths import BASE, Layout
from agent_r.loop.models import policy
from agent_r.loop.stages import search_settings
from agent_r.search import SearchSettings
from agent_r.settings import parse
from tests.loop.conftest import ROOT

SCRIPT = (ROOT / "reproduction" / "reproduce_paper.sh").read_text()


def commands(program: str) -> list[str]:
    """Every ``"$PY" <program>`` command line of the script, up to its redirection."""
    out, rest = [], SCRIPT
    while f'"$PY" {program}' in rest:
        rest = rest[rest.index(f'"$PY" {program}'):]
        out.append(rest[:rest.index(" > ")].replace("\\\n", " "))
        rest = rest[len(out[-1]):]
    return out


@pytest.mark.parametrize("which", [0, 1], ids=["shard", "rest"])
def test_its_iteration_1_search_writes_the_folder_the_loop_reads(which, tmp_path, textcraft_server):
    split = tmp_path / "tasks.json"
    split.write_text(json.dumps([{"item_id": "textcraft_1"}]))
    values = {"$ROOT": str(tmp_path / "run"), "$URL": textcraft_server, "$SPLIT": str(split), "$SHARDS": "2",
              "$i": "1", "$EXPLORATION_C": "0.25", "$MAX_NEW_TOKENS": "60", "$CONCURRENCY": "32",
              "$HF_BATCH_SIZE": "32"}
    command = commands("mcts_collection.py")[which].replace('${KV_CACHE_GIB:+--kv_cache_gib "$KV_CACHE_GIB"}',
                                                            "--kv_cache_gib 3")
    for var, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        command = command.replace(f'"{var}"', value).replace(var, value)
    env = {"TASK": "textcraft", "ITERA": "8", "N_GEN": "4", "MAX_DEPTH": "20", "TEMP": "1.0"}
    shard = parse(SearchSettings, shlex.split(command)[2:], env)

    loop = parse(IterateSettings, ["--env_server_base", textcraft_server, "--split_file", str(split),
                                   "--exploration_c", "0.25", "--max_new_tokens", "60", "--kv_cache_gib", "3"], env)
    base = policy(loop.backend, BASE, shard.backend.model_dir)
    read = search_settings(loop, "textcraft", Layout(tmp_path / "run").trees(1, BASE), base)
    assert shard.out_dir() == read.out_dir()
    assert (shard.iterations, shard.n_gen, shard.max_depth, shard.temperature, shard.c, shard.max_new_tokens) == \
        (read.iterations, read.n_gen, read.max_depth, read.temperature, read.c, read.max_new_tokens)
    assert shard.split_file == read.split_file
    assert shard.backend.kv_cache_gib == loop.backend.kv_cache_gib == 3      # KV_CACHE_GIB reaches both
    if which == 0:
        assert (shard.shard.shard_index, shard.shard.num_shards) == (1, 2)


def test_its_loop_flags_parse():
    """The iterate.py flags of the script exist (a renamed flag would only
    fail after the base eval, hours into a run)."""
    start = SCRIPT.index("LOOP=(iterate.py")
    words = shlex.split(SCRIPT[start + len("LOOP=("):SCRIPT.index(")", start)].replace("\\\n", " "))
    flags = [w.split("+", 1)[-1] for w in words[1:] if w.startswith("--") or w.startswith("${")]
    assert "--eval_limit" in flags and "--revise_limit" in flags   # the optional ones, ${VAR:+--flag "$VAR"}
    args = []
    for flag in flags:
        args += [flag, {"--name": "x", "--runs_dir": "r", "--env_server_base": "http://127.0.0.1:9",
                        "--split_file": "t.json", "--exploration_c": "0.25"}.get(flag, "7")]
    s = parse(IterateSettings, args, {})
    assert s.revise_max_steps == 7 and s.eval_max_steps == 7 and s.revise_limit == 7


def test_it_runs_from_a_private_copy_that_it_removes(tmp_path):
    """bash reads a script as it goes, so the hours-long run executes a copy
    (an edit of reproduction/reproduce_paper.sh mid-run would otherwise derail it);
    the copy is unlinked at once, and the checks still run in the repository."""
    import os
    import subprocess

    copies = tmp_path / "tmp"
    copies.mkdir()
    env = {**os.environ, "TMPDIR": str(copies), "RUNS": str(tmp_path / "runs"), "MODEL_DIR": str(tmp_path / "none")}
    env.pop("REPRODUCE_COPY", None)
    done = subprocess.run(["bash", str(ROOT / "reproduction" / "reproduce_paper.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"MODEL_DIR {tmp_path / 'none'} does not exist" in done.stderr
    assert list(copies.iterdir()) == []
    assert (tmp_path / "runs" / "repro_paper" / "logs").is_dir()


def test_its_results_copy_takes_greedy_summaries_and_leaves_sampled_ones(tmp_path):
    """A sampled eval run by hand into the run's eval folder must not come
    back as a second copy of the summary committed under passk/."""
    import subprocess

    run, out = tmp_path / "run", tmp_path / "out"
    greedy = run / "iter_1" / "eval" / "agent-r" / "textcraft" / "agent-r-iter1_test" / "summary.json"
    sampled = run / "iter_1" / "eval" / "agent-r" / "sampled" / "textcraft" / "agent-r-iter1_test_samples4" / "summary.json"
    for path in (greedy, sampled):
        path.parent.mkdir(parents=True)
        path.write_text("{}")
    for name in ("results.json", "results.md", "results.png", "tasks.json"):
        (run / name).write_text("x")
    out.mkdir()
    start = SCRIPT.index("copy_results() {")
    function = SCRIPT[start:SCRIPT.index("\n}\n", start) + 3]
    program = f'{function}\nROOT={run} REPRO_OUT={out} RESULTS=results EVALS=eval SPLIT={run}/tasks.json\ncopy_results 1\n'
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    copied = sorted(str(p.relative_to(out)) for p in out.rglob("summary.json"))
    assert copied == [str(greedy.relative_to(run))]


def test_in_pieces_across_fresh_machines_it_reaches_the_same_iteration(tmp_path, base_model):
    """The run in pieces as a fresh machine per command sees it: every step
    starts from an empty runs folder and the bank alone (base eval; two
    pieces of iteration 1's search and data; their merge, fine-tune and
    eval; the same for iteration 2, whose pieces fine-tune model_1 again).
    Test double: the loop's weights-playing policy, not a model."""
    import os
    import shutil
    import subprocess

    from pathlib import Path

    from reproduction.pieces import ARCHIVE, bank as bank_run, banked_files, restore, status
    from tests.loop.doubles import DOUBLE

    runs, bank = tmp_path / "runs", tmp_path / "bank"
    env = {**os.environ, "RUNS": str(runs), "NAME": "t", "MODEL_DIR": base_model, "TRAIN_TASKS": "4", "ITERA": "3",
           "N_GEN": "3", "MAX_DEPTH": "4", "EVAL_LIMIT": "2", "REVISE_LIMIT": "0", "EVAL_MAX_STEPS": "3",
           "REVISE_MAX_STEPS": "2", "VARIANTS": "good", "BANK": str(bank), "PY": str(ROOT / ".venv/bin/python"),
           "BACKEND": DOUBLE, "GENERAL_DATA": "", "EPOCHS": "1", "LR": "1e-3", "ACCUMULATIVE_COUNTS": "1",
           "MAX_LENGTH": "1024", "CONCURRENCY": "2", "MAX_NEW_TOKENS": "40", "SHARDS": "1",
           "REPRO_OUT": str(tmp_path / "results")}
    env.pop("REPRODUCE_COPY", None)

    def fresh_machine(**step: str) -> str:
        shutil.rmtree(runs, ignore_errors=True)
        done = subprocess.run(["bash", str(ROOT / "reproduction" / "reproduce_paper.sh")], env={**env, **step},
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done.stdout

    first = tmp_path / "first" / "t"   # the run's task list, as a first session banks it: tasks the double solves
    first.mkdir(parents=True)
    (first / "train_tasks.json").write_text(json.dumps([{"item_id": f"textcraft_{i}"} for i in (1, 2, 3, 4)]))
    bank_run(first, bank)
    fresh_machine(ITERATIONS="0")
    for j in (1, 2):
        assert f"piece {j}/2 of iteration 1" in fresh_machine(ITERATIONS="1", PIECE=f"{j}/2")
    fresh_machine(ITERATIONS="1", MERGE="2")
    rows = {(r["iteration"], r["variant"]): r for r in json.loads((runs / "t" / "results.json").read_text())["rows"]}
    assert set(rows) == {(0, "base"), (1, "good")}
    one = rows[(1, "good")]
    committed = json.loads((tmp_path / "results" / "results.json").read_text())
    assert {(r["iteration"], r["variant"]) for r in committed["rows"]} == {(0, "base"), (1, "good")}
    assert not list(runs.rglob("search_results_*.json")) or all("eval" in p.parts for p in runs.rglob(
        "search_results_*.json"))   # the merge session searched nothing: only its eval's episode files

    # DATA_FROM with DATA_ONLY=1 (make reproduce-smollm2-masked's first step): that run's rows merged as
    # this run's, exported with this run's MASK_REFUSED, marked with where they came from; nothing trained
    done = subprocess.run(["bash", str(ROOT / "reproduction" / "reproduce_paper.sh")],
                          env={**env, "NAME": "t-masked", "DATA_FROM": str(runs / "t"), "DATA_ONLY": "1",
                               "MASK_REFUSED": "1", "ITERATIONS": "1", "BANK": "",
                               "REPRO_OUT": str(tmp_path / "results-masked")},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "DATA_ONLY=1" in done.stdout
    masked = runs / "t-masked"
    stats = json.loads((masked / "iter_1" / "data" / "good" / ".done.json").read_text())["stats"]
    assert stats["data_from"] == "t" and stats["mask_refused"] is True
    assert (masked / "iter_0" / "eval" / "base" / ".done.json").is_file()   # the source's base eval, copied
    assert not (masked / "iter_1" / "model").exists()   # stopped before any fine-tune

    # iteration 2: each piece searches with model_1, fine-tuned again on its fresh machine
    for j in (1, 2):
        assert f"piece {j}/2 of iteration 2" in fresh_machine(ITERATIONS="2", PIECE=f"{j}/2")
        assert (runs / "t" / "iter_1" / "model" / "good" / "hf").is_dir()
    fresh_machine(ITERATIONS="2", MERGE="2")
    rows = {(r["iteration"], r["variant"]): r for r in json.loads((runs / "t" / "results.json").read_text())["rows"]}
    assert set(rows) == {(0, "base"), (1, "good"), (2, "good")}
    same = lambda row: {k: v for k, v in row.items() if k != "seconds"}  # noqa: E731
    assert same(rows[(1, "good")]) == same(one)   # its evals read back from the bank; model_1 made again, the same
    two = rows[(2, "good")]
    assert two["search"]["textcraft"]["trees"] == 4 and two["data"]["pieces"] == 2
    assert two["started_from"] == "iter_1/model/good/hf" and two["test"]["textcraft"]["tasks"] == 2
    assert one["search"]["textcraft"]["trees"] == 4 and one["data"]["pieces"] == 2
    assert one["train"]["trainer"] == "cpu" and one["test"]["textcraft"]["tasks"] == 2, (one["data"], one["train"])

    # another variant of iteration 1 on a machine of its own: the table it leaves (the run's and the
    # committed copy) keeps good's rows beside its own, its iteration 2 too, and the base's eval alone
    # does not replace it
    fresh_machine(ITERATIONS="1", VARIANTS="direct")
    for results in (runs / "t" / "results.json", tmp_path / "results" / "results.json"):
        rows = {(r["iteration"], r["variant"]): r for r in json.loads(results.read_text())["rows"]}
        assert set(rows) == {(0, "base"), (1, "good"), (2, "good"), (1, "direct")}, results
        assert same(rows[(1, "good")]) == same(one) and same(rows[(2, "good")]) == same(two)
    banked = sorted(p.relative_to(bank) for p in bank.rglob("*") if p.is_file())
    assert [p for p in banked if p.parts[0] != "episodes"] == sorted([
        Path(ARCHIVE), *(Path(f"pieces/t-i{k}-piece-0{j}-of-02/{ARCHIVE}") for k in (1, 2) for j in (1, 2))])
    episodes = [p for p in (runs / "t").rglob("search_results_*.json") if "eval" in p.parts[-5]]
    evals = {p.parent.relative_to(runs / "t") for p in episodes}      # every eval's episodes, an archive each
    assert [p for p in banked if p.parts[0] == "episodes"] == sorted(Path("episodes") / f"{e}.tar.gz" for e in evals)
    assert any(e.parts[:2] == ("iter_2", "eval") for e in evals)
    restored = tmp_path / "restored"
    # the last session banked all it had: its small state and its evals' episodes
    assert restore(bank, restored) == len(banked_files(runs / "t")) + len(episodes)
    rows, todo = status(bank, "t", 1, 2)   # what the next session reads to choose its pieces
    assert todo == [] and [r[:3] for r in rows] == [["1", "2", str(one["search"]["textcraft"]["trees_with_success"]
                                                                  - int(rows[1][2]))], ["2", "2", rows[1][2]]]
    assert all(float(r[-1]) > 0 for r in rows)   # its search samples/s, from the banked search manifest
    # another cut of the same tasks (PIECES changed mid-iteration): the banked pieces hold its three parts
    assert status(bank, "t", 1, 3) == ([["1/2", *rows[0][1:]], ["2/2", *rows[1][1:]]], [])
    assert status(bank, "t", 3, 2) == ([], [1, 2])   # an iteration not begun
