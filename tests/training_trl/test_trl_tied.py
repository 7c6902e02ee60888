"""TRL's saved model keeps a tied embedding/LM head as one tensor, in the
training precision's dtype too: on a GPU the weights are cast to bf16 before
saving, which made two tensors of the pair (3.7M parameters on disk for the
3.1M model). SAVE_DTYPE=bf16 takes that path on CPU."""
from __future__ import annotations

import pytest

from agent_r.training import trl_sft
from tests.support.saved_models import assert_saved_tied
from tests.training_trl.conftest import quick


@pytest.mark.parametrize("save_dtype", ["auto", "bf16"])
def test_trl_saves_the_tied_pair_once_in_any_dtype(save_dtype, trl_export, tiny_model_dir, tmp_path):
    stats = trl_sft.fine_tune(tiny_model_dir, [str(trl_export)], str(tmp_path / "run"), quick(save_dtype=save_dtype))
    assert_saved_tied(stats["hf"], tiny_model_dir)
