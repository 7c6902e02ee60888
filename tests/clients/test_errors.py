"""How the clients report server trouble: HTTP error statuses, malformed
answers and unreachable servers each become one error that names the server,
the endpoint and the env id, with the server's own message where it sent one."""
from __future__ import annotations

import pytest

from agentenv_client import EnvServerError, EnvServerUnreachable, TextCraftEnvClient, WebshopEnvClient
from tests.support.env_fixtures import free_port, start_server, stop_server


def test_http_error_status_is_reported_with_endpoint_and_id(webshop_double):
    """An HTTP 500 becomes an EnvServerError carrying status, endpoint and env id."""
    env = WebshopEnvClient(webshop_double, 3)
    env.close()
    with pytest.raises(EnvServerError) as info:
        env.reset(0)                                           # closed id: the server fails with 500
    assert info.value.status == 500 and info.value.endpoint == "reset" and info.value.env_id == env.env_id
    assert "HTTP 500" in str(info.value) and "/reset" in str(info.value)


def test_malformed_json_is_an_error_saying_so():
    """An answer that is not JSON is a server error (not "unreachable") saying so and naming the URL."""
    proc, url = start_server("tests.support.webshop_double", "--malformed")
    try:
        for cls in (WebshopEnvClient, TextCraftEnvClient):
            with pytest.raises(EnvServerError, match="malformed JSON") as info:
                cls(url, 3)
            assert not isinstance(info.value, EnvServerUnreachable) and url in str(info.value)
    finally:
        stop_server(proc)


def test_unreachable_server_names_url_and_how_to_start_one():
    """Nobody listening: the error names the URL and the command that starts the server;
    a URL without http:// is refused."""
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EnvServerUnreachable) as info:
        WebshopEnvClient(url, 3, max_retries=1)
    assert url in str(info.value) and "agentenv-webshop" in str(info.value)
    with pytest.raises(Exception, match="must start with http"):
        WebshopEnvClient("127.0.0.1:36003", 3)


def test_server_errors_surface_with_the_server_message(textcraft_server):
    """The server's own error line reaches the caller with endpoint, env id and URL;
    close is idempotent; a request the server cannot validate is an HTTP 422 error."""
    env = TextCraftEnvClient(textcraft_server, 544)
    dead_id = env.env_id
    env.close()
    env.close()  # idempotent
    probe = TextCraftEnvClient(textcraft_server, 544)
    probe.env_id = dead_id
    with pytest.raises(EnvServerError) as info:
        probe.step("inventory")
    assert info.value.server_message.startswith(f"The id {dead_id} is not valid")
    assert info.value.endpoint == "step" and info.value.env_id == dead_id
    assert "/step" in str(info.value) and textcraft_server in str(info.value)
    probe.env_id = None
    with pytest.raises(EnvServerError, match="HTTP 422"):
        probe._request("POST", "reset", json_body={"data_idx": 1})   # no id at all
