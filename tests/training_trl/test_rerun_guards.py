"""A rerun of a TRL run never returns a stale model. A finished run counts as
finished only while its hf/ model is there; the run key holds the
GENERAL_DATA file's content (ETA mixes it into the trained samples) and, for
ETO's DPO, the frozen reference model: another file or reference under the
same --out is refused in one line instead of answered with the old model."""
from __future__ import annotations

import json
import shutil

import pytest

from agent_r.settings import UsageError
from agent_r.training import eto, resume, trl_sft
from tests.support.model_fixtures import build_tiny_model
from tests.training_trl.conftest import quick
from tests.training_trl.test_eto import quick_dpo, write_trees
from tests.support import tree_fixtures as tf


def test_a_finished_run_whose_model_was_deleted_trains_again(trl_export, tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    first = trl_sft.fine_tune(tiny_model_dir, [str(trl_export)], str(out), quick())
    shutil.rmtree(out / "hf")
    assert (out / resume.DONE).exists()                     # the stats say finished, the model is gone
    again = trl_sft.fine_tune(tiny_model_dir, [str(trl_export)], str(out), quick())
    assert (out / "hf" / "config.json").exists() and again["hf"] == first["hf"]
    assert again["steps"] == first["steps"] and json.loads((out / resume.DONE).read_text()) == again
    monkeypatch.setattr(trl_sft, "prepare", lambda *a, **k: pytest.fail("a finished run was built again"))
    assert trl_sft.fine_tune(tiny_model_dir, [str(trl_export)], str(out), quick()) == again


def test_other_general_data_under_the_same_path_is_another_run(trl_export, general_file, tiny_model_dir, tmp_path,
                                                               monkeypatch):
    general = tmp_path / "general.json"
    shutil.copy(general_file, general)
    cfg = quick(general_data=str(general), eta=0.5)
    out = tmp_path / "run"
    done = trl_sft.fine_tune(tiny_model_dir, [str(trl_export)], str(out), cfg)
    monkeypatch.setattr(trl_sft, "prepare", lambda *a, **k: pytest.fail("a finished run was built again"))
    assert trl_sft.fine_tune(tiny_model_dir, [str(trl_export)], str(out), cfg) == done   # same content: finished

    convs = json.loads(general.read_text())
    general.write_text(json.dumps([{"conversations": [{"from": "human", "value": "Other?"},
                                                      {"from": "gpt", "value": "Other."}]}] + convs[1:]))
    with pytest.raises(UsageError, match=r"holds a run with other settings \(the data\)") as err:
        trl_sft.fine_tune(tiny_model_dir, [str(trl_export)], str(out), cfg)
    assert "\n" not in str(err.value)


def test_dpo_with_another_reference_model_is_another_run(tiny_model_dir, tmp_path, monkeypatch):
    trees = write_trees(tmp_path / "trees", [tf.tree_many_leaves(), tf.tree_shared_prefix()])
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps(eto.eto_pairs([str(trees)], 1.0)))
    out = tmp_path / "dpo"
    cfg = quick_dpo(epochs=1)
    done = eto.train_dpo(tiny_model_dir, str(pairs), str(out), cfg)
    monkeypatch.setattr(eto, "prepare_dpo", lambda *a, **k: pytest.fail("a finished run was built again"))
    assert eto.train_dpo(tiny_model_dir, str(pairs), str(out), cfg, ref_model_dir=tiny_model_dir) == done

    other = build_tiny_model(tmp_path / "other_reference", seed=1)
    with pytest.raises(UsageError, match=r"holds a run with other settings \(the reference model\)"):
        eto.train_dpo(tiny_model_dir, str(pairs), str(out), cfg, ref_model_dir=other)
