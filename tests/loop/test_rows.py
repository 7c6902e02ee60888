"""Each variant's results row, results.md and plots report the settings its
own trainer ran with: the eto variant's DPO reads ETO_EPOCHS, ETO_LR and
ETO_BETA (and no ALPHA), the fine-tuning variants this iteration's EPOCHS,
LR and ALPHA. The row once took EPOCHS for every variant: an eto row said
"epochs 2" for a DPO run of ETO_EPOCHS=3."""
from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from agent_r.loop import IterateSettings, trl_stages
from agent_r.loop.results import write_results
from agent_r.loop.runner import Loop
from agent_r.paths import Layout
from agent_r.settings import parse

KNOBS = {"VARIANTS": "agent-r,eto", "ITERATIONS": "2", "EPOCHS": "2,1", "LR": "3e-4", "ALPHA": "0.5,0.7",
         "ETO_EPOCHS": "3", "ETO_LR": "1e-3", "ETO_BETA": "0.2", "TASK": "textcraft"}


def settings() -> IterateSettings:
    s = parse(IterateSettings, [], KNOBS)
    s.finish()
    return s


def test_each_variants_row_holds_the_settings_its_trainer_gets():
    s = settings()
    loop = Loop(s, Layout(Path("unused")), pool=None, trainer="trl", base=None)
    assert loop.training_settings(1, "eto") == loop.training_settings(2, "eto") == {"epochs": 3, "lr": 1e-3,
                                                                                    "beta": 0.2}
    dpo = trl_stages.eto_config(s, s.train_knobs(1))           # what train_eto hands to the DPO trainer
    assert (dpo.epochs, dpo.lr, dpo.beta) == (3, 1e-3, 0.2)
    assert loop.training_settings(1, "agent-r") == {"alpha": {"textcraft": 0.5}, "epochs": 2, "lr": 3e-4}
    assert loop.training_settings(2, "agent-r") == {"alpha": {"textcraft": 0.7}, "epochs": 1, "lr": 3e-4}


def model_row(k: int, variant: str, settings: dict) -> dict:
    test = {"textcraft": {"tasks": 2, "success_pct": 50.0, "loops_pct": {}, "outcomes": {"1": 1, "2": 0}}}
    return {"iteration": k, "variant": variant, "test": test, "train": {"losses": [1.0, 0.5], "first_loss": 1.0,
                                                                        "last_loss": 0.5}, **settings}


def test_results_md_and_both_plots_label_each_variant_with_its_own_settings(tmp_path):
    s = settings()
    loop = Loop(s, Layout(tmp_path), pool=None, trainer="trl", base=None)
    base = {"iteration": 0, "variant": "base", "test": {"textcraft": {"tasks": 2, "success_pct": 0.0,
                                                                      "outcomes": {"1": 0, "2": 0}}}}
    rows = [base] + [model_row(k, v, loop.training_settings(k, v)) for k in (1, 2) for v in ("agent-r", "eto")]
    write_results(s, Layout(tmp_path), rows, "trl")

    md = (tmp_path / "results.md").read_text()
    assert "| iteration | variant | ALPHA / epochs / LR |" in md
    assert "| 1 | agent-r | 0.5 / 2 / 0.0003 |" in md and "| 2 | agent-r | 0.7 / 1 / 0.0003 |" in md
    assert "| 1 | eto | - / 3 / 0.001 (beta 0.2) |" in md and "| 2 | eto | - / 3 / 0.001 (beta 0.2) |" in md
    stored = {(r["iteration"], r["variant"]): r for r in json.loads((tmp_path / "results.json").read_text())["rows"]}
    assert (stored[(2, "eto")]["epochs"], stored[(2, "eto")]["beta"]) == (3, 0.2) and "alpha" not in stored[(2, "eto")]

    with Image.open(tmp_path / "results.png") as image:
        assert json.loads(image.text["Legend"]) == {"agent-r": "agent-r (epochs 2/1, LR 0.0003)",
                                                    "eto": "eto (DPO: epochs 3, LR 0.001, beta 0.2)"}
    with Image.open(tmp_path / "losses.png") as image:
        legend = json.loads(image.text["Legend"])
    assert legend["iteration 2"] == {"agent-r": "agent-r (epochs 1, LR 0.0003)",
                                     "eto": "eto (DPO: epochs 3, LR 0.001, beta 0.2)"}
