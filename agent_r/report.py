"""Reading finished eval runs: the summary numbers, the loop statistic, and
the side-by-side table of several runs (docs/evaluation.md, "Summary").

Kept apart from the runner (agent_r/evaluation.py) because a report needs no
model, no env server and no settings: only the result files on disk. So
``eval.py --compare`` works on any machine, and on folders written by the
reference scripts (no ``success``/``ended_by`` keys).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from agent_r import conversation as conv
from agent_r import passk, paths, provenance
from agent_r.significance import paired, wilson_interval
from agent_r.envs import EnvSpec, get_env
from agent_r.io import read_json
from agent_r.revision import (has_revision_thought, is_revision_turn, is_revision_wait, model_exchanges,
                              model_turns, revision_turns)
from agent_r.settings import UsageError

log = logging.getLogger(__name__)

LOOP_LENGTHS = (1, 2, 3, 4, 5)
ENDINGS = ("done", "disaster", "step_limit", "error")


def episode_actions(state: list[dict]) -> list[str]:
    """The actions of a stored trajectory (lower-cased, spaces collapsed), so
    "Get 1  Stick" and "get 1 stick" count as the same action in a loop."""
    return [" ".join(conv.parse_action(m["content"]).lower().split())
            for m in state[conv.HEAD_LEN:] if m.get("role") == "assistant"]


def _primitive(block: list[str]) -> bool:
    """False when the block is itself a shorter block repeated (a a, a b a b)."""
    k = len(block)
    return not any(k % d == 0 and block == block[:d] * (k // d) for d in range(1, k))


def count_repeats(actions: list[str], k: int) -> int:
    """Loops of period k: positions i where the block actions[i:i+k] is
    immediately repeated (actions[i+k:i+2k] is the same) and the block is not a
    shorter block repeated. A run of m identical actions counts m-1 at k=1 and
    nothing at k=2; "a b a b a b" counts 3 at k=2 (i = 0, 1, 2)."""
    return sum(
        1 for i in range(len(actions) - 2 * k + 1)
        if actions[i:i + k] == actions[i + k:i + 2 * k] and _primitive(actions[i:i + k])
    )


def load_results(run_dir: str | os.PathLike) -> list[dict]:
    """Every per-task result in a run directory, ordered by file name. A
    corrupt file is skipped with a warning: the report covers what is readable
    (the runner redoes such files on its next invocation)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} does not exist")
    results = []
    for path in paths.result_files(run_dir):
        try:
            data = read_json(path)
        except ValueError as exc:
            log.warning("skipping %s", exc)
            continue
        if isinstance(data, dict) and "env_score" in data and "state" in data:
            results.append(data)
        else:
            log.warning("skipping %s: not a result file", path)
    return results


def summarize(results: list[dict], max_score: float) -> dict[str, Any]:
    """Aggregate numbers of a run. Scores are normalised by the task's max
    score (SciWorld 100) and reported x100, the paper's unit; failed episodes
    count with score 0."""
    n = len(results)
    ended = {e: sum(1 for r in results if r.get("ended_by") == e) for e in ENDINGS}
    loops = {}
    for k in LOOP_LENGTHS:
        counts = [count_repeats(episode_actions(r["state"]), k) for r in results]
        with_loop = sum(1 for c in counts if c)
        loops[str(k)] = {"episodes": with_loop, "fraction": with_loop / n if n else 0.0, "count": sum(counts)}

    def mean(xs: list[float]) -> float:
        return sum(xs) / n if n else 0.0

    return {
        "tasks": n,
        # rounded so 0.14 * 100 shows as 14.0 in summary.json, not 14.000000000000002
        "score_x100": round(100.0 * mean([float(r["env_score"]) / max_score for r in results]), 6),
        "success_rate": mean([1.0 if _success(r, max_score) else 0.0 for r in results]),
        "mean_steps": mean([float(r["step_num"]) for r in results]),
        "step_limit": ended["step_limit"],
        "disaster": ended["disaster"],
        "failed": ended["error"],
        "loops": loops,
    }


def _success(result: dict, max_score: float) -> bool:
    if "success" in result:
        return bool(result["success"])
    return float(result["env_score"]) >= max_score  # files written by the reference scripts


def revision_turn_counts(results: list[dict], task: str) -> dict[str, Any]:
    """Episodes with a revision turn of the model's own (agent_r.revision),
    how many of them succeeded and how many revised exactly once, the turns
    in all, how many revision ``wait`` turns the run answered itself
    (WAIT_REPLY=ok: what tells a run of each WAIT_REPLY apart), and what the
    model's next turn after each revision turn does (``after``: ``goal_craft``,
    ``get``, ``craft``, ``revision`` for another revision turn, ``end`` where
    the episode ended; ``EnvSpec.action_kind``)."""
    spec = get_env(task)
    counts = [revision_turns(r, task) for r in results]
    after: dict[str, int] = {}
    for result, n in zip(results, counts):
        for kind in turns_after_revision(result, spec) if n else []:
            after[kind] = after.get(kind, 0) + 1
    turns = [model_turns(r) for r in results]
    sentence = [sum(1 for t in ts if has_revision_thought(t)) for ts in turns]
    bare = [sum(1 for t in ts if is_revision_wait(t, task) and not has_revision_thought(t)) for ts in turns]
    return {"episodes": sum(1 for n in counts if n),
            "succeeded": sum(1 for n, r in zip(counts, results) if n and r.get("success")),
            "once": sum(1 for n in counts if n == 1),
            "turns": sum(counts), "wait_replies": sum(int(r.get("wait_replies") or 0) for r in results),
            "after": dict(sorted(after.items())),
            "sentence": _kind_counts(sentence, results), "bare_wait": _kind_counts(bare, results),
            "ten_or_more": sum(1 for n in counts if n >= 10)}


def _kind_counts(counts: list[int], results: list[dict]) -> dict[str, int]:
    """Episodes with a turn of one kind, how many of them succeeded, and the turns."""
    return {"episodes": sum(1 for n in counts if n),
            "succeeded": sum(1 for n, r in zip(counts, results) if n and r.get("success")), "turns": sum(counts)}


def refused_action_counts(results: list[dict], task: str) -> dict[str, Any]:
    """How often the environment refused the model's own actions (an unknown
    command, a craft without its ingredients: ``EnvSpec.refused``), per
    episode: the mean, the distribution, and how many of the refusals
    answered a revision ``wait``. What a model trained on refused steps
    learns shows here first."""
    spec = get_env(task)
    per_episode, of_wait = [], 0
    for result in results:
        refused = [(turn, reply) for turn, reply in model_exchanges(result) if reply is not None and spec.refused(reply)]
        per_episode.append(len(refused))
        of_wait += sum(1 for turn, _ in refused if is_revision_wait(turn, task))
    histogram: dict[int, int] = {}
    for n in per_episode:
        histogram[n] = histogram.get(n, 0) + 1
    return {"episodes": len(results), "refused": sum(per_episode),
            "mean": round(sum(per_episode) / len(per_episode), 3) if per_episode else None,
            "per_episode": {str(n): histogram[n] for n in sorted(histogram)}, "of_revision_waits": of_wait}


def accepted_repeat_tail(result: dict, spec: EnvSpec) -> int:
    """How many of the episode's last actions are one action repeated with
    the environment accepting it each time (``get 4 oak log`` answered ``Got
    4 oak log`` to the turn limit): the loop a model trained only on
    accepted steps can learn from paths that repeat them, as the refused
    revision loop is learnt from refused steps. 0 when the last action was
    refused."""
    run, last = 0, None
    for turn, reply in reversed([(t, r) for t, r in model_exchanges(result) if r is not None]):
        action = " ".join(conv.parse_action(turn).lower().split())
        if spec.refused(reply) or (last is not None and action != last):
            break
        run, last = run + 1, action
    return run


def turns_after_revision(result: dict, spec: EnvSpec) -> list[str]:
    """The kind of the model turn after each of an episode's revision turns."""
    state = result.get("state", [])
    # the task's own observations (the instruction before them may hold an example's goal)
    goal = spec.goal([m.get("content", "") for m in state[conv.HEAD_LEN - 1:] if m.get("role") == "user"])
    turns = model_turns(result)
    kinds = []
    for i, turn in enumerate(turns):
        if not is_revision_turn(turn, spec.name):
            continue
        if i + 1 == len(turns):
            kinds.append("end")
        elif is_revision_turn(turns[i + 1], spec.name):
            kinds.append("revision")
        else:
            nxt = turns[i + 1]
            kinds.append(spec.action_kind(conv.parse_action(nxt) if conv.has_action(nxt) else "", goal))
    return kinds


def summarize_dir(run_dir: str | os.PathLike, spec: EnvSpec) -> dict[str, Any]:
    """A run folder's summary. A sampled run (``--samples K``) also counts
    episodes and successes per task and gives Pass@k (agent_r/passk.py);
    its ``tasks`` counts tasks, ``episodes`` result files, and the other
    numbers are over every episode (the success rate is Pass@1)."""
    results = load_results(run_dir)
    summary = {"run_dir": str(run_dir), "task": spec.name, **summarize(results, spec.max_score),
               "revision_turns": revision_turn_counts(results, spec.name),
               "refused_actions": refused_action_counts(results, spec.name)}
    if any("sample" in r for r in results):
        counts = passk.task_counts(results, lambda r: _success(r, spec.max_score))
        summary.update(tasks=len(counts), episodes=len(results),
                       samples=max(c["episodes"] for c in counts.values()),
                       pass_at_k=passk.summarize(counts), per_task=counts)
    return summary


def run_labels(summaries: list[dict[str, Any]]) -> list[str]:
    """How a table or plot names each run: its folder's name."""
    return path_labels([s["run_dir"] for s in summaries])


def path_labels(run_dirs: list[str]) -> list[str]:
    """Each run's folder name, led by the folders of its path that tell it
    from another run of the same name: the same model's eval in two runs
    (``runs/smollm2`` and ``runs/smollm2-masked``) reads
    ``smollm2/agent-r-iter1_test`` and ``smollm2-masked/agent-r-iter1_test``,
    not twice the same column head."""
    paths = [Path(d).absolute().parts for d in run_dirs]
    labels = []
    for i, parts in enumerate(paths):
        twins = [other for j, other in enumerate(paths) if j != i and other[-1] == parts[-1]]
        differing = [part for k, part in enumerate(parts[:-1])
                     if any(k >= len(other) - 1 or other[k] != part for other in twins)]
        labels.append("/".join(differing + [parts[-1]]))
    return labels


def format_table(summaries: list[dict[str, Any]], labels: list[str] | None = None,
                 extra: list[tuple[str, list[str]]] | None = None) -> str:
    """Runs side by side, one column each (iteration 0 vs 1 vs 2); ``extra``
    rows go last."""
    labels = labels or run_labels(summaries)
    rows: list[tuple[str, list[str]]] = [
        ("task", [s["task"] for s in summaries]),
        ("tasks", [str(s["tasks"]) for s in summaries]),
        ("score x100", [f"{s['score_x100']:.2f}" for s in summaries]),
        ("success rate %", [f"{100 * s['success_rate']:.2f}" for s in summaries]),
        ("mean steps", [f"{s['mean_steps']:.2f}" for s in summaries]),
        ("ended by step limit", [str(s["step_limit"]) for s in summaries]),
        ("ended by disaster", [str(s["disaster"]) for s in summaries]),
        ("failed (env error)", [str(s["failed"]) for s in summaries]),
    ]
    for k in LOOP_LENGTHS:
        cells = [f"{100 * s['loops'][str(k)]['fraction']:.1f} / {s['loops'][str(k)]['count']}" for s in summaries]
        rows.append((f"loop k={k} % eps / count", cells))
    rows.append(("revision turn eps (won)", [_revision_cell(s) for s in summaries]))
    rows.append(("next turn after one", [_after_cell(s) for s in summaries]))
    rows.append(("wins: no revision / revised", [_wins_cell(s) for s in summaries]))
    rows.append(("revising eps: sentence / bare", [_kinds_cell(s) for s in summaries]))
    rows.append(("eps with >= 10 revision turns", [_ten_cell(s) for s in summaries]))
    rows.append(("refused actions per episode", [_refused_cell(s) for s in summaries]))
    rows += _pass_rows(summaries) + (extra or [])
    first = max(len(r[0]) for r in rows)
    widths = [max(len(labels[i]), *(len(r[1][i]) for r in rows)) for i in range(len(summaries))]

    def line(name: str, cells: list[str]) -> str:
        return "  ".join([name.ljust(first)] + [c.rjust(w) for c, w in zip(cells, widths)])

    return "\n".join([line("metric", labels), line("-" * first, ["-" * w for w in widths])]
                     + [line(name, cells) for name, cells in rows])


def _pass_rows(summaries: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Pass@k of sampled runs with its 95% interval, each run's difference
    from the first, paired by task, and the tasks each solves that the other
    never does (none without a sampled run)."""
    ks = sorted({int(k) for s in summaries for k in s.get("pass_at_k", {})})
    rows: list[tuple[str, list[str]]] = []
    for k in ks:
        cells = [passk.percent_cell(s.get("pass_at_k", {}).get(str(k))) for s in summaries]
        rows.append((f"pass@{k} % [95% CI]", cells))
    first = summaries[0].get("per_task")
    for k in ks if first and len(summaries) > 1 else []:
        cells = ["-"] + [passk.percent_cell(passk.paired_difference(first, s["per_task"], k), signed=True)
                         if s.get("per_task") else "-" for s in summaries[1:]]
        rows.append((f"pass@{k} - first, paired", cells))
    if first and len(summaries) > 1 and ks:
        rows.append(("solved >=1: only / first only", ["-"] + [_overlap_cell(first, s.get("per_task"))
                                                                for s in summaries[1:]]))
    return rows


def _overlap_cell(first: dict[str, Any], other: dict[str, Any] | None) -> str:
    """Tasks only this run solves at least once, tasks only the first does, and
    tasks both do, on the tasks both played: "6 / 0 (28 both, of 100)"."""
    got = passk.solved_overlap(first, other) if other else None
    if not got:
        return "-"
    return f"{got['only_other']} / {got['only_reference']} ({got['both']} both, of {got['tasks']})"


def _revision_cell(summary: dict[str, Any]) -> str:
    """Revising episodes, how many succeeded and the 95% Wilson interval of
    that fraction: "45 (2, 1-15%)". The interval is there because the
    fraction rests on tens of episodes, where a bare percentage misleads."""
    got = summary.get("revision_turns")
    return _won(got["episodes"], got["succeeded"]) if got else "-"


def _won(episodes: int, succeeded: int) -> str:
    """ "45 (2, 1-15%)": episodes, successes and the successes' Wilson interval."""
    interval = wilson_interval(succeeded, episodes)
    if interval is None:
        return "0 (0)"
    return f"{episodes} ({succeeded}, {100 * interval[0]:.0f}-{100 * interval[1]:.0f}%)"


def _wins_cell(summary: dict[str, Any]) -> str:
    """The run's successful episodes split into those without a revision turn
    and those with one: "70 / 19". A gain over the base made of the second
    kind is the turn's doing; one made of the first is a better first try."""
    got = summary.get("revision_turns")
    if not got:
        return "-"
    wins = round(summary["success_rate"] * summary.get("episodes", summary["tasks"]))
    return f"{wins - got['succeeded']} / {got['succeeded']}"


def _kinds_cell(summary: dict[str, Any]) -> str:
    """Revising episodes by the kind of their revision turns, each with its
    successes and their Wilson interval: "79 (9, 6-20%) / 1 (0, 0-79%)".
    Sampled runs revise with bare ``wait``s that greedy ones hardly write,
    and a claim about the turn (a share of sentence-writing episodes that
    then succeed) says which kind it counts. "-" for a summary written
    before the kinds were counted."""
    got = summary.get("revision_turns") or {}
    if "sentence" not in got:
        return "-"
    return " / ".join(_won(got[k]["episodes"], got[k]["succeeded"]) for k in ("sentence", "bare_wait"))


def _ten_cell(summary: dict[str, Any]) -> str:
    """Episodes that revise ten times or more: the loop a model learns from
    training data full of its own refused revision turns."""
    got = (summary.get("revision_turns") or {}).get("ten_or_more")
    return "-" if got is None else str(got)


def _refused_cell(summary: dict[str, Any]) -> str:
    """The environment's refusals of the model's actions: the mean per
    episode and, in brackets, how many of all of them answered a revision
    ``wait``: "17.60 (312 of 1760 at a wait)"."""
    got = summary.get("refused_actions")
    if not got or got.get("mean") is None:
        return "-"
    return f"{got['mean']:.2f} ({got['of_revision_waits']} of {got['refused']} at a wait)"


AFTER_KINDS_SHOWN = 6


def _after_cell(summary: dict[str, Any]) -> str:
    """What the turns after revision turns do, most frequent first: "goal_craft 5, get 2".
    Sampled runs write dozens of one-off non-actions there ("continue[0]",
    "thank"); past the first six kinds they are summed, so the table stays
    readable (summary.json keeps every kind)."""
    after = (summary.get("revision_turns") or {}).get("after") or {}
    ranked = sorted(after.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = [f"{k} {n}" for k, n in ranked[:AFTER_KINDS_SHOWN]]
    rest = ranked[AFTER_KINDS_SHOWN:]
    if rest:
        shown.append(f"{len(rest)} other kinds {sum(n for _, n in rest)}")
    return ", ".join(shown) or "-"


def env_of_run(run_dir: str | os.PathLike, task: str | None = None) -> EnvSpec:
    """Which environment a run directory holds, so runs of different tasks can
    be compared without TASK: its summary.json says, else the parent folder
    name ({output_dir}/{TASK}/{model}) does, else the ``task`` the user set."""
    run_dir = Path(run_dir)
    summary = paths.summary_file(run_dir)
    if summary.exists():
        try:
            return get_env(read_json(summary)["task"])
        except (ValueError, KeyError, TypeError, AttributeError, UsageError):
            pass
    try:
        return get_env(run_dir.resolve().parent.name)
    except UsageError:
        if task:
            return get_env(task)
        raise UsageError(f"cannot tell which task {run_dir} holds: set TASK=textcraft|sciworld|webshop") from None


def compare_summaries(run_dirs: list[str], task: str | None = None) -> list[dict[str, Any]]:
    """The summaries of several finished runs, for the table and the plot; runs nothing."""
    return [summarize_dir(d, env_of_run(d, task)) for d in run_dirs]


def outcomes(run_dir: str | os.PathLike, spec: EnvSpec) -> dict[str, int]:
    """Each episode's success (1/0) by its result file's key: what pairs two
    runs of the same tasks (two replies, two dtypes, two models)."""
    out = {}
    for path in paths.result_files(run_dir):
        try:
            result = read_json(path)
        except ValueError:
            continue
        if isinstance(result, dict) and "env_score" in result:
            out[path.stem[len(paths.RESULT_PREFIX):]] = int(_success(result, spec.max_score))
    return out


def _paired_rows(run_dirs: list[str], summaries: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Each run against the first, episode by episode on the keys both hold:
    gained / lost and McNemar's exact p (greedy runs; a sampled run pairs
    by Pass@k above instead)."""
    if len(run_dirs) < 2 or any("per_task" in s for s in summaries):
        return []
    specs = [get_env(s["task"]) for s in summaries]
    first = outcomes(run_dirs[0], specs[0])
    cells = ["-"]
    for run_dir, spec in zip(run_dirs[1:], specs[1:]):
        got = paired(first, outcomes(run_dir, spec))
        cells.append(f"{got['gained']} / {got['lost']} (p {got['p_value']:.3g}) of {got['tasks']}" if got else "-")
    return [("vs first: gained / lost (p)", cells)]


def compare(run_dirs: list[str], task: str | None = None, summaries: list[dict[str, Any]] | None = None) -> str:
    """The table of several finished runs (``summaries``: their compare_summaries, when the
    caller has them already), each greedy run paired with the first; runs nothing.
    Each run made under other conditions than the first is warned of (``provenance.warnings``)."""
    summaries = compare_summaries(run_dirs, task) if summaries is None else summaries
    for line in provenance.warnings(run_dirs, path_labels(run_dirs)):
        log.warning("%s", line)
    return format_table(summaries, extra=_paired_rows(run_dirs, summaries))
