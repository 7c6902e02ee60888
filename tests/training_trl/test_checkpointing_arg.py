"""GRADIENT_CHECKPOINTING reaches SFTConfig and DPOConfig under the name the
installed transformers takes: ``activation_checkpointing`` from 5.23 on,
``gradient_checkpointing`` before (the name 5.23 keeps as an alias). Passing
the new name to an older release crashed TRAINER=trl and the eto variant
after the search (`make check-floors` runs this on transformers 5.18, before the rename)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from trl import DPOConfig, SFTConfig

from agent_r.training import eto, trl_sft, trl_shared
from tests.training_trl.conftest import quick
from tests.training_trl.test_eto import quick_dpo


@pytest.mark.parametrize("knob, on", [("1", True), ("0", False), ("auto", False)])   # auto: off without CUDA
def test_the_installed_trl_configs_take_the_setting(knob, on, tmp_path):
    sft = trl_sft.sft_args(tmp_path, quick(gradient_checkpointing=knob))
    dpo = eto.dpo_args(tmp_path, quick_dpo(gradient_checkpointing=knob))
    assert sft.gradient_checkpointing is on and dpo.gradient_checkpointing is on
    for args in (sft, dpo):
        if hasattr(args, "activation_checkpointing"):
            assert args.activation_checkpointing is on


def test_the_keyword_follows_the_fields_of_the_config_class():
    @dataclass
    class Before523:                     # transformers before 5.23: only the old name
        gradient_checkpointing: bool = False

    @dataclass
    class From523:                       # 5.23 on: the new name, the old one a deprecated alias
        activation_checkpointing: bool = False
        gradient_checkpointing: bool = False

    cfg = quick(gradient_checkpointing="1")
    assert trl_shared.checkpointing_kwargs(Before523, cfg) == {"gradient_checkpointing": True}
    assert trl_shared.checkpointing_kwargs(From523, cfg) == {"activation_checkpointing": True}
    assert trl_shared.checkpointing_kwargs(SFTConfig, cfg) == trl_shared.checkpointing_kwargs(DPOConfig, cfg)
