"""eval.py --samples K: K episodes per task with seeds of their own, Pass@k
by the unbiased estimator with a bootstrap interval over tasks, resume per
episode, and K = 1 files exactly as eval.py wrote them before sampling
existed (tests/evaluation/golden_k1, written at commit 47e67f7's parent).

The model is a test double whose chance of solving each task is known: at
its first turn it draws u from the request's seed and follows the expert
plan when u < p(task), else it loops on the inventory. So which episodes
succeed can be worked out here from the seeds alone."""
import json
import math
from pathlib import Path

import pytest

from agent_r import conversation as conv
from agent_r import evaluation as ev
from agent_r import passk, paths, report
from agent_r.llm import derive_seed
from agent_r.manifest import git_commit, machine
from agent_r.provenance import UNKNOWN
from agent_r.settings import UsageError
from agentenv_servers.textcraft_expert import solve
from tests.support.doubles import ScriptedBackend
from tests.support.eval_runs import config, expert_or_loop, goal_of, model_turns, run_eval, split_file

GOLDEN = Path(__file__).parent / "golden_k1"
GOLDEN_ADDED = Path(__file__).parent / "golden_k1_summary_added.json"   # the summary's fields added since GOLDEN
ADDED_SINCE_GOLDEN = ("provenance", "refused_actions")
ADDED_TO_REVISION_TURNS = ("sentence", "bare_wait", "ten_or_more")
TASKS = [0, 1, 3, 4]                 # expert plans of 2 steps each


def draw(seed: int) -> float:
    return (seed % 10_000) / 10_000


def known_odds_policy(odds: dict[str, float]):
    """Solves a task (by its goal) with probability ``odds[goal]``, decided by
    the first turn's seed; every turn names its seed."""

    def policy(messages, i, seed):
        plan = solve(messages[conv.HEAD_LEN - 1]["content"])
        k = model_turns(messages)
        first = messages[conv.HEAD_LEN]["content"] if k else None
        if k == 0:
            action = plan.steps[0].turn() if draw(seed) < odds[plan.goal] else "Action: inventory"
        elif first.endswith(plan.steps[0].turn().split("\n")[-1]) and k < len(plan.steps):
            action = plan.steps[k].turn()
        else:
            action = "Action: inventory"
        return f"Thought: seed {seed}.\n" + action.split("\n")[-1]

    return policy


def odds_by_goal(p_by_task: dict[int, float]) -> dict[str, float]:
    return {goal_of(i)[0]: p for i, p in p_by_task.items()}


def sampled(tmp_path, url, k, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    return config(tmp_path, url, split_file(tmp_path, TASKS), eval_samples=k, temperature=1.0, concurrency=8, **kw)


def expected_counts(cfg, p_by_task):
    return {str(i): {"episodes": cfg.eval_samples,
                     "successes": sum(draw(derive_seed(cfg.seed, f"{i}_s{j}", 0)) < p_by_task[i]
                                      for j in range(cfg.eval_samples))}
            for i in TASKS}


# --------------------------------------------------------------------------- the estimator

@pytest.mark.parametrize("n,c,k,value", [(8, 2, 4, 1 - 15 / 70), (8, 0, 4, 0.0), (8, 8, 1, 1.0), (4, 1, 1, 0.25),
                                         (5, 3, 3, 1.0), (10, 3, 10, 1.0)])
def test_estimator_values(n, c, k, value):
    assert passk.pass_at_k(n, c, k) == pytest.approx(value)


@pytest.mark.parametrize("n,k", [(4, 1), (8, 2), (8, 4), (8, 8), (16, 5)])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_estimator_is_unbiased_against_the_closed_form(n, k, p):
    """Averaged over the binomial law of c, the estimate is 1 - (1 - p)^k exactly."""
    mean = sum(math.comb(n, c) * p ** c * (1 - p) ** (n - c) * passk.pass_at_k(n, c, k) for c in range(n + 1))
    assert mean == pytest.approx(1 - (1 - p) ** k, abs=1e-12)


def test_estimator_refuses_k_above_n():
    with pytest.raises(ValueError, match="Pass@5 needs at least 5 episodes"):
        passk.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        passk.pass_at_k(4, 5, 1)


def test_k_grid_doubles_then_ends_at_n():
    assert passk.k_grid(1) == [1]
    assert passk.k_grid(8) == [1, 2, 4, 8]
    assert passk.k_grid(6) == [1, 2, 4, 6]


def test_bootstrap_interval_brackets_the_mean_and_is_fixed():
    values = [0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.75, 1.0]
    low, high = passk.bootstrap_interval(values)
    assert low < sum(values) / len(values) < high
    assert (low, high) == passk.bootstrap_interval(values)
    assert passk.bootstrap_interval([0.5] * 5) == (0.5, 0.5)


# --------------------------------------------------------------------------- a sampled eval end to end

def test_sampled_eval_counts_each_tasks_successes_and_pass_at_k(tmp_path, textcraft_server):
    p_by_task = {0: 0.0, 1: 1.0, 3: 0.5, 4: 0.25}
    cfg = sampled(tmp_path, textcraft_server, 8)
    done = ev.evaluate(cfg, ScriptedBackend(known_odds_policy(odds_by_goal(p_by_task))))
    summary = done.summary
    assert done.run_dir.name == "scripted_eval_samples8"
    assert (summary["tasks"], summary["episodes"], summary["samples"]) == (4, 32, 8)
    want = expected_counts(cfg, p_by_task)
    assert summary["per_task"] == want
    assert want["0"]["successes"] == 0 and want["1"]["successes"] == 8
    assert 0 < want["3"]["successes"] < 8
    assert list(summary["pass_at_k"]) == ["1", "2", "4", "8"]
    for k, entry in summary["pass_at_k"].items():
        k = int(k)
        closed = [1 - math.comb(8 - c["successes"], k) / math.comb(8, k) for c in want.values()]
        assert entry["value"] == pytest.approx(sum(closed) / 4, abs=1e-6)
        assert entry["ci95"][0] <= entry["value"] <= entry["ci95"][1]
    assert summary["success_rate"] == pytest.approx(summary["pass_at_k"]["1"]["value"], abs=1e-6)
    one = json.loads(paths.result_file(done.run_dir, "3_s5").read_text())
    assert (one["task_id"], one["task_key"], one["sample"]) == (3, "3", 5)
    assert json.loads(paths.summary_file(done.run_dir).read_text())["per_task"] == want


def test_samples_of_a_task_batch_together(tmp_path, textcraft_server):
    """The first model call holds every sample of the first task (same prompt:
    the engine's prefix cache serves it once)."""
    backend = ScriptedBackend(known_odds_policy(odds_by_goal({i: 0.5 for i in TASKS})))
    ev.evaluate(sampled(tmp_path, textcraft_server, 4), backend)
    first = backend.batches[0].requests
    assert len(first) == 8 and len({json.dumps(r.messages) for r in first[:4]}) == 1


def test_a_rerun_gives_the_same_episodes_and_samples_differ(tmp_path, textcraft_server):
    policy = known_odds_policy(odds_by_goal({i: 0.5 for i in TASKS}))
    runs = []
    for name in ("a", "b"):
        cfg = sampled(tmp_path / name, textcraft_server, 4)
        runs.append(ev.evaluate(cfg, ScriptedBackend(policy)).run_dir)
    files = sorted(p.name for p in runs[0].glob("search_results_*.json"))
    assert len(files) == 16
    for name in files:
        assert json.loads((runs[0] / name).read_text())["state"] == json.loads((runs[1] / name).read_text())["state"]
    firsts = {json.loads((runs[0] / f"search_results_3_s{j}.json").read_text())["state"][conv.HEAD_LEN]["content"]
              for j in range(4)}
    assert len(firsts) == 4   # four seeds, four first turns


class Interrupted(Exception):
    pass


class GatedBackend(ScriptedBackend):
    """Test double: stops the run at its ``stop_at``-th model call, a known
    point (as a kill would, without racing a clock)."""

    def __init__(self, policy, stop_at):
        super().__init__(policy)
        self.stop_at = stop_at

    def generate(self, requests, sampling):
        if self.stats.calls + 1 == self.stop_at:
            raise Interrupted
        return super().generate(requests, sampling)


def test_an_interrupted_eval_redoes_only_the_missing_episodes(tmp_path, textcraft_server):
    policy = known_odds_policy(odds_by_goal({0: 0.3, 1: 0.9, 3: 0.6, 4: 0.1}))
    whole = ev.evaluate(sampled(tmp_path / "whole", textcraft_server, 8), ScriptedBackend(policy)).run_dir
    cfg = sampled(tmp_path / "cut", textcraft_server, 8)
    with pytest.raises(Interrupted):
        ev.evaluate(cfg, GatedBackend(policy, stop_at=4))
    kept = {p.name: p.stat().st_mtime_ns for p in paths.eval_dir(cfg).glob("search_results_*.json")}
    assert 0 < len(kept) < 32
    again = ScriptedBackend(policy)
    rerun = ev.evaluate(cfg, again)
    assert (rerun.ran, rerun.skipped) == (32 - len(kept), len(kept))
    seeds = {r.seed for b in again.batches for r in b.requests}
    redone = {f"{i}_s{j}" for i in TASKS for j in range(8)} - {n[len("search_results_"):-5] for n in kept}
    assert {derive_seed(cfg.seed, key, 0) for key in redone} <= seeds
    assert not {derive_seed(cfg.seed, n[len("search_results_"):-5], 0) for n in kept} & seeds
    assert {p.name: p.stat().st_mtime_ns for p in rerun.run_dir.glob("search_results_*.json") if p.name in kept} == kept
    for p in whole.glob("search_results_*.json"):
        assert json.loads(p.read_text()) == json.loads((rerun.run_dir / p.name).read_text())
    for key in ("per_task", "pass_at_k", "success_rate"):
        assert rerun.summary[key] == json.loads(paths.summary_file(whole).read_text())[key]


def test_one_sample_writes_the_files_eval_wrote_before_sampling(tmp_path, textcraft_server):
    expert = expert_or_loop({goal_of(1)[0]})
    policy = lambda m, i, s: f"Thought: seed {s}.\n" + expert(m, i, s).split("\n")[-1]  # noqa: E731
    cfg = config(tmp_path, textcraft_server, split_file(tmp_path, [0, 1, 2]), max_steps=4, eval_samples=1)
    run_dir = ev.evaluate(cfg, ScriptedBackend(policy)).run_dir
    written = sorted(p.name for p in run_dir.glob("*.json") if not p.name.startswith("manifest"))
    assert written == sorted(p.name for p in GOLDEN.iterdir())
    for name in written:
        text = (run_dir / name).read_text().replace(str(tmp_path), "<tmp>").replace(textcraft_server, "<server>")
        if name == "summary.json":   # fields summaries gained after the golden files, additive: left out
            got, want = json.loads(text), json.loads((GOLDEN / name).read_text())
            added = {key: got.pop(key) for key in ADDED_SINCE_GOLDEN}
            added["revision_turns"] = {key: got["revision_turns"].pop(key) for key in ADDED_TO_REVISION_TURNS}
            assert got == want
            # the added fields against golden values of their own; the machine and commit are this run's
            assert added["provenance"].pop("machines") == [machine()]
            assert added["provenance"].pop("commits") == [git_commit() or UNKNOWN]
            assert added == json.loads(GOLDEN_ADDED.read_text())
        else:
            assert text == (GOLDEN / name).read_text(), name


# --------------------------------------------------------------------------- usage and --compare

def test_samples_with_greedy_decoding_is_a_usage_error(tmp_path):
    cfg = config(tmp_path, "http://127.0.0.1:9", split_file(tmp_path, [0]), eval_samples=4, temperature=0.0)
    with pytest.raises(UsageError, match="TEMP=0 is greedy"):
        cfg.finish()
    done = run_eval(["--samples", "4", "--split_file", split_file(tmp_path, [0])], env={"TASK": "textcraft",
                                                                                     "TEMP": "0"})
    assert done.returncode == 2
    assert "TEMP=0 is greedy" in done.stderr and "Traceback" not in done.stderr


def test_compare_shows_pass_at_k_and_the_paired_difference(tmp_path, textcraft_server):
    low = ev.evaluate(sampled(tmp_path / "low", textcraft_server, 4),
                      ScriptedBackend(known_odds_policy(odds_by_goal({0: 0.0, 1: 0.5, 3: 0.25, 4: 0.0}))))
    high = ev.evaluate(sampled(tmp_path / "high", textcraft_server, 4),
                       ScriptedBackend(known_odds_policy(odds_by_goal({0: 1.0, 1: 1.0, 3: 0.5, 4: 0.25}))))
    table = report.compare([str(low.run_dir), str(high.run_dir)])
    diff = passk.paired_difference(low.summary["per_task"], high.summary["per_task"], 4)
    mean = sum(passk.pass_at_k(4, high.summary["per_task"][t]["successes"], 4)
               - passk.pass_at_k(4, low.summary["per_task"][t]["successes"], 4) for t in map(str, TASKS)) / 4
    assert diff["value"] == pytest.approx(mean, abs=1e-6) and diff["tasks"] == 4
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert set(lines) >= {"pass@1 % [95% CI]", "pass@2 % [95% CI]", "pass@4 % [95% CI]", "pass@4 - first, paired"}
    assert f"{100 * diff['value']:+.1f} [" in lines["pass@4 - first, paired"]
    overlap = passk.solved_overlap(low.summary["per_task"], high.summary["per_task"])
    assert overlap["only_other"] >= 1 and overlap["only_reference"] == 0     # task 0: odds 1.0 against 0.0
    assert (f"{overlap['only_other']} / 0 ({overlap['both']} both, of 4)"
            in lines["solved >=1: only / first only"])
