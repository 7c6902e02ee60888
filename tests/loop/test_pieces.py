"""A run in pieces (reproduction/pieces.py): an iteration's search and data split
over task parts (iterate.py with STOP_AFTER=data), merged into the whole
run, banked without trees or weights, restored into an empty runs folder and
carried on to training and evaluation there. The merged data must be the
data the whole run makes from the same tasks, byte for byte."""
from __future__ import annotations

import dataclasses
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from agent_r.envs import get_env
from agent_r.io import read_json
from agent_r.loop import run
from agent_r.loop.stages import export_rows
from agent_r.settings import UsageError
from reproduction import pieces
from tests.loop.conftest import FLAGS, SMALL, settings_for

TASKS = [{"item_id": f"textcraft_{i}"} for i in (1, 2, 3, 4)]
VARIANTS = "agent-r,direct,good,eto"


def stop_after_data(tmp_path: Path, base_model: str, server: str, name: str, tasks: list[dict]):
    split = tmp_path / f"{name}_tasks.json"
    split.write_text(json.dumps(tasks))
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "ITERATIONS": "1", "VARIANTS": VARIANTS,
           "STOP_AFTER": "data"}
    s = settings_for(env, FLAGS + ["--split_file", str(split), "--env_server_base", server,
                                   "--runs_dir", str(tmp_path / "runs"), "--name", name])
    result = run(s)
    assert result.exit_code == 0, result.incomplete
    assert "STOP_AFTER=data" in result.table and not result.rows
    return s


def marker(folder: Path) -> dict:
    return read_json(folder / ".done.json")


@pytest.fixture(scope="module")
def whole_and_merged(tmp_path_factory, base_model, textcraft_server):
    tmp = tmp_path_factory.mktemp("pieces")
    s = stop_after_data(tmp, base_model, textcraft_server, "whole", TASKS)
    split = tmp / "whole_tasks.json"
    parts = [stop_after_data(tmp, base_model, textcraft_server, f"piece{j}", pieces.slice_tasks(split, j, 2))
             for j in (1, 2)]
    runs = tmp / "runs"
    merged = pieces.merge([runs / "piece1", runs / "piece2"], runs / "merged", 1,
                          lambda variant, files, out: export_rows(s, files, out, base_model))
    return runs, merged, parts


def test_stop_after_data_searches_and_builds_data_but_trains_and_evaluates_nothing(whole_and_merged):
    runs, _, _ = whole_and_merged
    it = runs / "whole" / "iter_1"
    assert marker(it / "trees" / "base")["stage"] == "search"
    assert {p.parent.name for p in (it / "data").glob("*/.done.json")} == set(VARIANTS.split(","))
    assert not (it / "model").exists() and not (runs / "whole" / "iter_0").exists()   # not even the base eval


def test_merged_pieces_equal_the_whole_runs_data(whole_and_merged):
    runs, merged, _ = whole_and_merged
    whole, joined = runs / "whole" / "iter_1", runs / "merged" / "iter_1"
    assert merged.keys() == {"iter_1/trees/base", *(f"iter_1/data/{v}" for v in VARIANTS.split(","))}
    search = marker(whole / "trees" / "base")["stats"]
    assert marker(joined / "trees" / "base")["stats"] == search
    assert search["textcraft"]["trees"] == len(TASKS)
    samples = 0
    for variant in VARIANTS.split(","):
        made, got = whole / "data" / variant, joined / "data" / variant
        for jsonl in made.glob("*.jsonl"):
            assert (got / jsonl.name).read_text() == jsonl.read_text(), (variant, jsonl.name)
        if (made / "train.json").exists():
            assert read_json(got / "train.json") == read_json(made / "train.json"), variant
        stats = marker(got)["stats"]
        assert stats.pop("pieces") == 2
        assert stats == marker(made)["stats"], variant
        samples += stats["train_samples"]
    assert samples > 0   # the comparison covered real rows


def refused_losses(train_json: Path) -> list[bool]:
    """The ``loss`` of every assistant turn the environment then refused, in the export's order."""
    spec = get_env("textcraft")
    return [turn["loss"] for sample in read_json(train_json) for turn, reply in zip(sample["messages"],
                                                                                     sample["messages"][1:])
            if turn["role"] == "assistant" and reply["role"] == "user" and spec.refused(reply["content"])]


def test_a_run_on_another_runs_rows_exports_them_again_with_its_own_mask(whole_and_merged, tmp_path, base_model):
    """DATA_FROM (reproduce_paper.sh): a run that trains on another run's rows
    merges that run as its one piece; the rows are the same bytes, the export
    is redone with this run's MASK_REFUSED, and the marker says both."""
    runs, _, (s, _) = whole_and_merged
    masked = dataclasses.replace(s, mask_refused=True)
    written = pieces.merge([runs / "whole"], tmp_path / "masked", 1,
                           lambda variant, files, out: export_rows(masked, files, out, base_model),
                           ["agent-r", "good"], {"mask_refused": True, "data_from": "whole"})
    assert set(written) == {"iter_1/trees/base", "iter_1/data/agent-r", "iter_1/data/good"}
    refused = {True: 0, False: 0}
    for variant in ("agent-r", "good"):
        made, got = runs / "whole" / "iter_1" / "data" / variant, tmp_path / "masked" / "iter_1" / "data" / variant
        for jsonl in made.glob("*.jsonl"):
            assert (got / jsonl.name).read_bytes() == jsonl.read_bytes()
        stats = marker(got)["stats"]
        assert stats["mask_refused"] is True and stats["data_from"] == "whole"
        assert stats["train_samples"] == marker(made)["stats"]["train_samples"]
        before, after = refused_losses(made / "train.json"), refused_losses(got / "train.json")
        assert len(before) == len(after) and not any(after)   # kept as history, never trained
        refused[True] += sum(before)
    assert refused[True] > 0   # the unmasked export trained refused turns: the mask changed something


def test_the_merge_command_marks_the_recipe_and_the_run_it_took_rows_from(whole_and_merged, tmp_path, base_model,
                                                                         monkeypatch):
    """`pieces merge` (reproduce_paper.sh's DATA_FROM) reads iterate.py's
    settings from the environment: each data marker says MASK_REFUSED and the
    run whose rows it exported, which the pair tables and a rerun rely on."""
    runs, _, _ = whole_and_merged
    for key, value in {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "ITERATIONS": "1",
                       "VARIANTS": "agent-r,good", "MASK_REFUSED": "1"}.items():
        monkeypatch.setenv(key, value)
    pieces.loop_merge([runs / "whole"], tmp_path / "masked", 1, list(FLAGS), data_from="runs/whole")
    for variant in ("agent-r", "good"):
        stats = marker(tmp_path / "masked" / "iter_1" / "data" / variant)["stats"]
        assert stats["mask_refused"] is True and stats["data_from"] == "runs/whole", variant
    monkeypatch.setenv("MASK_REFUSED", "0")
    pieces.loop_merge([runs / "whole"], tmp_path / "paper", 1, list(FLAGS))
    stats = marker(tmp_path / "paper" / "iter_1" / "data" / "agent-r")["stats"]
    assert "mask_refused" not in stats and "data_from" not in stats


def test_a_banked_merge_goes_on_to_train_and_evaluate_without_its_trees(whole_and_merged, tmp_path, base_model,
                                                                        textcraft_server):
    runs, _, (s, _) = whole_and_merged
    bank = tmp_path / "bank"
    assert pieces.bank(runs / "merged", bank) > 0
    banked = archived(bank)
    assert not [p for p in banked if p.name.startswith("search_results_") or ".parts" in p.parts], banked
    fresh = tmp_path / "runs"
    assert pieces.restore(bank, fresh / "merged") == len(banked)
    assert pieces.restore(bank, fresh / "merged") == 0   # never over a file the run has
    before = (bank / pieces.ARCHIVE).read_bytes()
    pieces.bank(fresh / "merged", bank)
    assert (bank / pieces.ARCHIVE).read_bytes() == before   # the same state, the same bytes: nothing to commit

    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "ITERATIONS": "1", "VARIANTS": "good"}
    result = run(settings_for(env, FLAGS + ["--split_file", s.split_file, "--env_server_base", textcraft_server,
                                            "--runs_dir", str(fresh), "--name", "merged", "--revise_limit", "0"]))
    assert result.exit_code == 0, result.incomplete
    row = next(r for r in result.rows if r["iteration"] == 1)
    assert row["data"]["train_samples"] == marker(runs / "merged" / "iter_1" / "data" / "good")["stats"][
        "train_samples"] > 0
    assert row["train"]["trainer"] == "cpu" and row["test"]["textcraft"]["tasks"] == 3
    assert not list((fresh / "merged").rglob("iter_1/trees/**/search_results_*.json"))   # nothing was searched
    # the bank of the finished run has its evals' small files, and of the model only its train marker
    pieces.bank(fresh / "merged", bank)
    banked = archived(bank)
    assert Path("iter_1/eval/good/.done.json") in banked
    assert [p for p in banked if p.parts[:2] == ("iter_1", "model")] == [Path("iter_1/model/good/.done.json")]
    assert not [p for p in banked if p.name.startswith("search_results_")]   # no episode file in the state
    # ... but every eval's episodes in an archive of their own, restored where they were, the same bytes again
    episodes = {p.relative_to(fresh / "merged") for p in (fresh / "merged").rglob("search_results_*.json")
                if "eval" in p.parts[-5]}
    archives = sorted(p.relative_to(bank / pieces.EPISODES) for p in (bank / pieces.EPISODES).rglob("*.tar.gz"))
    assert {str(a)[:-len(".tar.gz")] for a in archives} == {str(e.parent) for e in episodes}
    assert any(a.parts[:2] == ("iter_1", "eval") for a in archives)
    again = tmp_path / "again"
    pieces.restore(bank, again / "merged")
    assert {p.relative_to(again / "merged") for p in (again / "merged").rglob("search_results_*.json")} == episodes
    for rel in episodes:
        assert (again / "merged" / rel).read_bytes() == (fresh / "merged" / rel).read_bytes()
    before = {a: (bank / pieces.EPISODES / a).read_bytes() for a in archives}
    pieces.bank(again / "merged", bank)
    assert {a: (bank / pieces.EPISODES / a).read_bytes() for a in archives} == before


def test_an_unfinished_evals_episodes_are_banked_so_the_next_machine_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    folder = run_dir / "iter_2" / "eval_wait_ok" / "agent-r" / "textcraft" / "agent-r-iter2_test_wait_ok"
    folder.mkdir(parents=True)
    (folder / "search_results_5.json").write_text('{"success": true}')   # no done-marker: still running
    bank = tmp_path / "bank"
    pieces.bank(run_dir, bank)
    (folder / "search_results_5.json").write_text('{"success": false}')   # a run's own file is never overwritten
    assert pieces.restore(bank, run_dir) == 0
    fresh = tmp_path / "fresh"
    pieces.restore(bank, fresh)
    got = fresh / folder.relative_to(run_dir) / "search_results_5.json"
    assert got.read_text() == '{"success": true}'


def test_an_evals_manifest_and_summary_travel_with_its_episodes_without_machine_paths(tmp_path):
    """They name the machines that played the episodes: a fresh machine that
    restores and resumes the eval names them too."""
    from agent_r.paths import REPOSITORY
    run_dir = tmp_path / "run"
    folder = run_dir / "iter_1" / "eval_amx" / "good" / "sampled" / "textcraft" / "good-iter1_test_samples4"
    folder.mkdir(parents=True)
    (folder / "search_results_5_0.json").write_text('{"success": true}')
    model = str(REPOSITORY / "runs" / "r" / "iter_1" / "model" / "good" / "hf")
    (folder / "manifest.json").write_text(json.dumps({"backend": {"model_dir": model}, "machines": ["CPU A"]}))
    pieces.bank(run_dir, tmp_path / "bank")
    fresh = tmp_path / "fresh"
    pieces.restore(tmp_path / "bank", fresh)
    restored = json.loads((fresh / folder.relative_to(run_dir) / "manifest.json").read_text())
    assert restored == {"backend": {"model_dir": "runs/r/iter_1/model/good/hf"}, "machines": ["CPU A"]}
    (folder / "summary.json").write_text('{"provenance": {"machines": ["CPU A"]}}')   # the eval finished
    pieces.bank(run_dir, tmp_path / "bank")
    pieces.restore(tmp_path / "bank", fresh)
    assert (fresh / folder.relative_to(run_dir) / "summary.json").read_text() == \
        '{"provenance": {"machines": ["CPU A"]}}'


def archived(bank: Path) -> list[Path]:
    with tarfile.open(bank / pieces.ARCHIVE) as tar:
        return [Path(m.name) for m in tar.getmembers()]


def test_an_unreadable_bank_is_a_usage_error_that_says_how_to_recover(tmp_path):
    (tmp_path / pieces.ARCHIVE).write_bytes(b"not a tar archive")
    with pytest.raises(UsageError, match="unreadable.*git checkout"):
        pieces.restore(tmp_path, tmp_path / "run")
    assert pieces.restore(tmp_path / "none", tmp_path / "run") == 0   # nothing banked yet: nothing to do


def test_merge_refuses_a_piece_whose_data_is_unfinished(whole_and_merged, tmp_path):
    runs, _, _ = whole_and_merged
    with pytest.raises(UsageError, match="not finished"):
        pieces.merge([runs / "piece1", tmp_path / "missing"], tmp_path / "into", 1, lambda *a: 0)


@pytest.fixture
def direct_unfinished_in_piece2(whole_and_merged, tmp_path) -> list[Path]:
    """The two pieces, the second a copy whose direct data stage has not finished
    (that variant's pieces still running while agent-r's are done)."""
    runs, _, _ = whole_and_merged
    piece2 = tmp_path / "piece2"
    shutil.copytree(runs / "piece2", piece2, symlinks=True)
    (piece2 / "iter_1" / "data" / "direct" / ".done.json").unlink()
    return [runs / "piece1", piece2]


def count_rows(variant: str, files: list[str], out: Path) -> int:
    return sum(len(Path(f).read_text().splitlines()) for f in files)


def test_merge_of_some_variants_ignores_another_variants_unfinished_pieces(whole_and_merged,
                                                                          direct_unfinished_in_piece2, tmp_path):
    _, merged, _ = whole_and_merged
    with pytest.raises(UsageError, match="data/direct is not finished"):
        pieces.merge(direct_unfinished_in_piece2, tmp_path / "all", 1, count_rows)
    written = pieces.merge(direct_unfinished_in_piece2, tmp_path / "some", 1, count_rows, ["agent-r"])
    assert set(written) == {"iter_1/trees/base", "iter_1/data/agent-r"}
    assert written["iter_1/trees/base"] == merged["iter_1/trees/base"]
    drop = lambda stats: {k: v for k, v in stats.items() if k != "train_samples"}   # noqa: E731
    assert drop(written["iter_1/data/agent-r"]) == drop(merged["iter_1/data/agent-r"])
    assert not (tmp_path / "some" / "iter_1" / "data" / "direct").exists()
    with pytest.raises(UsageError, match="no finished data stage of sciworld-only"):
        pieces.merge(direct_unfinished_in_piece2, tmp_path / "none", 1, count_rows, ["sciworld-only"])


def test_status_of_one_variant_lists_its_own_pieces_still_to_run(direct_unfinished_in_piece2, tmp_path):
    bank = tmp_path / "bank"
    for j, run_folder in enumerate(direct_unfinished_in_piece2, start=1):
        pieces.bank(run_folder, bank / "pieces" / f"r-i1-piece-{j:02d}-of-02")
    samples = {v: marker(direct_unfinished_in_piece2[0] / "iter_1" / "data" / v)["stats"]["train_samples"]
               for v in VARIANTS.split(",")}
    rows, todo = pieces.status(bank, "r", 1, 2, "agent-r")
    assert todo == [] and [r[0] for r in rows] == ["1", "2"] and rows[0][4] == str(samples["agent-r"])
    rows, todo = pieces.status(bank, "r", 1, 2, "direct")
    assert todo == [2] and rows[0][4] == str(samples["direct"])
    rows, _ = pieces.status(bank, "r", 1, 2)
    assert rows[0][4] == str(sum(samples.values()))


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_slices_cover_the_task_list_once_in_order(tmp_path, n):
    split = tmp_path / "tasks.json"
    tasks = [{"item_id": f"textcraft_{i}"} for i in range(7)]
    split.write_text(json.dumps(tasks))
    joined = [t for j in range(1, n + 1) for t in pieces.slice_tasks(split, j, n)]
    assert joined == tasks


@pytest.mark.parametrize("part,of", [(0, 2), (3, 2), (1, 8)])
def test_a_slice_outside_the_list_is_a_usage_error(tmp_path, part, of):
    split = tmp_path / "tasks.json"
    split.write_text(json.dumps([{"item_id": f"textcraft_{i}"} for i in range(7)]))
    with pytest.raises(UsageError, match="need 1 <= part <= of"):
        pieces.slice_tasks(split, part, of)


def test_a_restored_run_fine_tunes_again_only_what_a_stage_still_to_run_reads(tmp_path, base_model,
                                                                              textcraft_server, monkeypatch):
    """The bank keeps train markers, not weights: a rerun of the finished
    run fine-tunes nothing; with iteration 2's eval undone it fine-tunes
    model_1 and model_2 again, to the same weights (the double plays by the
    weights, so equal results mean equal models); with iteration 2's data
    undone too it searches its lost trees again, to the same data."""
    from agent_r.training import cpu

    real, calls = cpu.fine_tune, []
    monkeypatch.setattr(cpu, "fine_tune", lambda model_dir, *a, **k: calls.append(model_dir) or real(model_dir, *a, **k))
    split = tmp_path / "tasks.json"
    split.write_text(json.dumps(TASKS[:2]))
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "ITERATIONS": "2", "VARIANTS": "good"}

    def rerun(runs: Path):
        result = run(settings_for(env, FLAGS + ["--split_file", str(split), "--env_server_base", textcraft_server,
                                                "--runs_dir", str(runs), "--name", "r", "--revise_limit", "0"]))
        assert result.exit_code == 0, result.incomplete
        return [{k: v for k, v in r.items() if k != "seconds"} for r in result.rows]

    first = rerun(tmp_path / "a")
    assert len(calls) == 2 and first[2]["data"]["train_samples"] > 0
    pieces.bank(tmp_path / "a" / "r", tmp_path / "bank")
    fresh = tmp_path / "b" / "r"
    pieces.restore(tmp_path / "bank", fresh)
    calls.clear()
    assert rerun(tmp_path / "b") == first and calls == []   # every eval done: no model is read

    (fresh / "iter_2" / "eval" / "good" / ".done.json").unlink()
    assert rerun(tmp_path / "b") == first
    assert calls == [base_model, str(fresh / "iter_1" / "model" / "good" / "hf")]

    calls.clear()
    (fresh / "iter_2" / "eval" / "good" / ".done.json").unlink()
    (fresh / "iter_2" / "data" / "good" / ".done.json").unlink()
    assert not list((fresh / "iter_2" / "trees").rglob("search_results_*.json"))
    assert rerun(tmp_path / "b") == first and calls == []   # model_1 and model_2 are here now
    assert list((fresh / "iter_2" / "trees").rglob("search_results_*.json"))
    assert (read_json(fresh / "iter_2" / "data" / "good" / "train.json")
            == read_json(tmp_path / "a" / "r" / "iter_2" / "data" / "good" / "train.json"))


def test_merged_statistics_add_counts_and_histograms_and_recompute_the_mean():
    one = {"tasks": {"textcraft": {"pairs": 2, "first_bad": {"1": 1, "3": 1}, "mean_first_bad_step": 2.0}},
           "train_samples": 4}
    none = {"tasks": {"textcraft": {"pairs": 0, "first_bad": {}, "mean_first_bad_step": None}}, "train_samples": 0}
    three = {"tasks": {"textcraft": {"pairs": 1, "first_bad": {"3": 1, "none": 2}, "mean_first_bad_step": 3.0}},
             "train_samples": 2}
    assert pieces.merge_stats([one, none, three]) == {
        "tasks": {"textcraft": {"pairs": 3, "first_bad": {"1": 1, "3": 2, "none": 2}, "mean_first_bad_step": 2.333}},
        "train_samples": 6}
    assert pieces.merge_stats([none, none])["tasks"]["textcraft"]["mean_first_bad_step"] is None


# --------------------------------------------------------------------------- pieces of two PIECES in one bank

RUN_TASKS = [{"item_id": f"textcraft_{i}"} for i in range(10)]


def bank_piece(bank: Path, tmp_path: Path, j: int, of: int, variants: tuple[str, ...] = ("agent-r",),
               tasks: list[dict] | None = None) -> str:
    """Banks a finished piece of iteration 2 (its task list, search and data markers) as the run would."""
    name = pieces.piece_name("r", 2, j, of)
    run = tmp_path / "runs" / name
    own = RUN_TASKS[(j - 1) * len(RUN_TASKS) // of: j * len(RUN_TASKS) // of] if tasks is None else tasks
    (run / "iter_2").mkdir(parents=True)
    (run / pieces.SPLIT_FILE).write_text(json.dumps(own))
    for v in variants:
        for stage, folder, stats in (("search", "trees", {"textcraft": {"trees": len(own), "trees_with_success": 1}}),
                                     ("data", "data", {"tasks": {"textcraft": {}}, "train_samples": 2 * len(own)})):
            (run / "iter_2" / folder / v).mkdir(parents=True)
            (run / "iter_2" / folder / v / ".done.json").write_text(
                json.dumps({"stage": stage, "stats": stats, "seconds": 60}))
    pieces.bank(run, bank / "pieces" / name)
    return name


@pytest.fixture
def bank_of_run(tmp_path) -> Path:
    """A bank holding the run's task list (10 tasks), as the whole run banks it."""
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / pieces.SPLIT_FILE).write_text(json.dumps(RUN_TASKS))
    pieces.bank(run, tmp_path / "bank")
    return tmp_path / "bank"


def test_a_run_that_cuts_its_pieces_larger_mid_iteration_keeps_the_small_ones_it_finished(bank_of_run, tmp_path):
    small = [bank_piece(bank_of_run, tmp_path, j, 10) for j in range(1, 7)]   # tasks 0-5 in pieces of one task
    rows, todo = pieces.status(bank_of_run, "r", 2, 5, "agent-r")
    assert todo == [4, 5]   # part 3 of 5 (tasks 4, 5) is held by pieces 5 and 6 of 10
    assert [r[0] for r in rows] == [f"{j}/10" for j in range(1, 7)] and rows[0][1:3] == ["1", "1"]
    with pytest.raises(UsageError, match=r"r-i2-piece-04-of-05, r-i2-piece-05-of-05 .*PIECE=j/5"):
        pieces.cover(bank_of_run, "r", 2, 5, ["agent-r"])
    large = [bank_piece(bank_of_run, tmp_path, j, 5) for j in (4, 5)]
    assert pieces.status(bank_of_run, "r", 2, 5, "agent-r")[1] == []
    assert pieces.cover(bank_of_run, "r", 2, 5, ["agent-r"]) == small + large
    assert pieces.status(bank_of_run, "r", 2, 10, "agent-r")[1] == []   # and the other way, the same cover


def test_a_run_that_cuts_its_pieces_smaller_keeps_the_large_ones_and_runs_only_the_rest(bank_of_run, tmp_path):
    bank_piece(bank_of_run, tmp_path, 1, 5)   # tasks 0, 1
    rows, todo = pieces.status(bank_of_run, "r", 2, 10, "agent-r")
    assert todo == list(range(3, 11)) and [r[0] for r in rows] == ["1/5"]


def test_pieces_count_only_for_their_own_variants_and_their_own_tasks(bank_of_run, tmp_path):
    bank_piece(bank_of_run, tmp_path, 1, 10, ("direct",))
    bank_piece(bank_of_run, tmp_path, 2, 10, tasks=[{"item_id": "textcraft_99"}])   # cut from another task list
    bank_piece(bank_of_run, tmp_path, 3, 10, ("agent-r", "direct"))
    assert pieces.status(bank_of_run, "r", 2, 10, "agent-r")[1] == [1, 2] + list(range(4, 11))
    assert pieces.status(bank_of_run, "r", 2, 10, "direct")[1] == [2] + list(range(4, 11))
    assert pieces.status(bank_of_run, "r", 2, 5, "direct")[1] == [1, 2, 3, 4, 5]   # part 1 of 5 needs task 1 too


def test_without_the_runs_task_list_only_pieces_of_the_same_cut_count(tmp_path):
    bank = tmp_path / "bank"
    bank_piece(bank, tmp_path, 1, 10)
    assert pieces.status(bank, "r", 2, 10, "agent-r")[1] == list(range(2, 11))
    assert pieces.status(bank, "r", 2, 5, "agent-r")[1] == [1, 2, 3, 4, 5]


def test_the_cover_command_prints_the_pieces_a_merge_restores(bank_of_run, tmp_path, capsys):
    names = [bank_piece(bank_of_run, tmp_path, j, 2) for j in (1, 2)]
    assert pieces.main(["cover", "--bank", str(bank_of_run), "--name", "r", "--iteration", "2", "--of", "10",
                        "--variants", "agent-r,"]) == 0
    assert capsys.readouterr().out.strip() == ",".join(names)
