"""The SmolLM2 base's verifier subsample keeps every judgement kind: the
project's own verifier data (scripts/make_verifier_data, real, on the base
third) sampled one in 8 holds Good, Bad and Uncertain answers in about the
file's proportions (a strided slice of it held only Good ones)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from scripts.make_smollm2_base import ROOT, TASKS_FROM, one_in


def verdict(row: dict) -> str:
    return row["messages"][-1]["content"].rsplit("Judgment:", 1)[-1].strip()


def test_one_in_eight_verifier_rows_keep_the_files_mix_of_judgements(tmp_path):
    out = tmp_path / "verifier.jsonl"
    subprocess.run([sys.executable, "-m", "scripts.make_verifier_data", "--tasks", str(TASKS_FROM),
                    "--out", str(out)], check=True, cwd=ROOT, capture_output=True)
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    picked = one_in(rows, 8)
    assert len(picked) == len(rows) // 8 and picked == one_in(rows, 8)      # seeded: the same sample each time
    whole, sample = Counter(map(verdict, rows)), Counter(map(verdict, picked))
    assert set(sample) == set(whole) >= {"Good", "Bad"}
    for kind in ("Good", "Bad"):
        assert abs(sample[kind] / len(picked) - whole[kind] / len(rows)) < 0.1
    assert one_in(rows, 1) == rows
    assert [verdict(r) for r in rows[::8]].count("Good") > 0.9 * len(rows[::8])   # why a strided slice fails


def test_data_only_writes_the_bases_own_recipe_as_the_loops_general_data(tmp_path, capsys):
    """reproduction/reproduce_paper.sh replays the SmolLM2 base's own training rows at
    ETA: two expert episodes per taught task and the seeded 1 in 8 verifier
    rows, sized by the base's tokenizer (a tiny ChatML one here)."""
    from scripts.make_smollm2_base import main
    from tests.support.chat_families import build_family_model

    model = build_family_model(tmp_path / "chatml", "chatml")
    work = tmp_path / "general"
    assert main(["--data_only", "1", "--work", str(work), "--tokenizer", model]) == 0
    files = capsys.readouterr().out.strip().split(",")
    assert files == [str(work / "policy.json"), str(work / "verifier_all.json")]
    policy, verifier = (json.loads(Path(f).read_text()) for f in files)
    assert len(policy) == 2 * len(json.loads(TASKS_FROM.read_text())["policy"])
    every = [json.loads(line) for line in (work / "verifier_all.jsonl").read_text().splitlines() if line.strip()]
    assert verifier == [{"messages": r["messages"]} for r in one_in(every, 8)]
    assert all(any(m["role"] == "assistant" for m in r["messages"]) for r in policy + verifier)
