"""WebshopEnvClient against WebShopServerDouble (tests/support/webshop_double.py),
and the client behaviours every env shares: busy retries, HTTP errors,
malformed answers, unreachable servers."""
from __future__ import annotations

import pytest
import requests

from agentenv_client import EnvServerError, EnvServerUnreachable, TextCraftEnvClient, WebshopEnvClient
from tests.support.env_fixtures import free_port, start_server, stop_server


@pytest.fixture(scope="module")
def webshop_double():
    proc, url = start_server("tests.support.webshop_double")
    yield url
    stop_server(proc)


def test_webshop_episode_to_a_purchase(webshop_double):
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


def test_busy_server_is_retried_then_reported(webshop_double):
    with WebshopEnvClient(webshop_double, 3, max_retries=4) as env:
        env.reset(0)
        requests.post(f"{webshop_double}/_busy", json={"n": 2})
        assert env.step("search[shirt]").done is False       # 503, 503, then OK
        assert requests.get(f"{webshop_double}/health").json()["busy_left"] == 0
        requests.post(f"{webshop_double}/_busy", json={"n": 50})
        with pytest.raises(EnvServerError, match=r"busy \(HTTP 503\) after 2 tries"):
            WebshopEnvClient(webshop_double, 3, max_retries=2).step("search[shirt]")
        requests.post(f"{webshop_double}/_busy", json={"n": 0})


def test_http_error_status_is_reported_with_endpoint_and_id(webshop_double):
    env = WebshopEnvClient(webshop_double, 3)
    env.close()
    with pytest.raises(EnvServerError) as info:
        env.reset(0)                                           # closed id: the server fails with 500
    assert info.value.status == 500 and info.value.endpoint == "reset" and info.value.env_id == env.env_id
    assert "HTTP 500" in str(info.value) and "/reset" in str(info.value)


def test_malformed_json_is_an_error_saying_so():
    proc, url = start_server("tests.support.webshop_double", "--malformed")
    try:
        for cls in (WebshopEnvClient, TextCraftEnvClient):
            with pytest.raises(EnvServerError, match="malformed JSON") as info:
                cls(url, 3)
            assert not isinstance(info.value, EnvServerUnreachable) and url in str(info.value)
    finally:
        stop_server(proc)


def test_unreachable_server_names_url_and_how_to_start_one():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EnvServerUnreachable) as info:
        WebshopEnvClient(url, 3, max_retries=1)
    assert url in str(info.value) and "agentenv-webshop" in str(info.value)
    with pytest.raises(Exception, match="must start with http"):
        WebshopEnvClient("127.0.0.1:36003", 3)
