"""The WebShop client through whole episodes against WebShopServerDouble
(tests/support/webshop_double.py): the real WebShop server cannot ship."""
from __future__ import annotations

from agentenv_client import WebshopEnvClient


def test_webshop_episode_to_a_purchase(webshop_double):
    """Search, pick and buy the right product: reward 1 and done; the wrong product
    scores 0; the conversation starts with the WebShop instruction and "Ok."."""
    with WebshopEnvClient(webshop_double, data_len=3) as env:
        assert isinstance(env.env_id, int)
        env.reset(1)
        first = env.observe()
        assert first.startswith("WebShop [SEP] Instruction:") and "blue wool scarf" in first
        assert env.info["observation"] == first
        assert env.step("search[blue wool scarf]").state.count("[SEP]") > 4
        assert env.step("click[B02]").state.endswith("Buy Now")
        out = env.step("click[Buy Now]")
        assert out.reward == 1.0 and out.done is True
        env.reset(0)
        env.step("search[shirt]")
        env.step("click[B03]")
        assert env.step("click[Buy Now]").reward == 0.0   # wrong product
        assert "Ok." == env.conversation_start[1]["value"] and "click[" in env.instruction
