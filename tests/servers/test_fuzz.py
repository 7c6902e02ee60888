"""Malformed requests to our env servers (TextCraft and SciWorld), over real
HTTP: every one gets a JSON answer, never a bare 500 page, and every refusal
carries an "error" line naming the problem (the field, bad JSON, a lone
surrogate, a wrong method or path). Property-based: hypothesis draws the
bodies, fields and query strings; a fixed profile (tests/conftest.py) keeps
the draws reproducible, so a failure here is a real bug, not luck."""
from __future__ import annotations

import json
import math

import pytest
import requests

from tests.support.env_fixtures import start_server, stop_server

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
# any text a model might emit: all of Unicode, lone surrogates included
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
TEXT_WITH_SURROGATE = st.tuples(ANY_TEXT, SURROGATES, ANY_TEXT).map("".join)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12)


def _numberish(text: str) -> bool:
    """Text a lax integer parser might still read as a number."""
    try:
        float(text.replace("_", ""))
        return True
    except ValueError:
        return False


# never an integer, also to pydantic's lax parsing (which reads true as 1 and "1.0" as 1)
NOT_AN_INT = (st.none() | st.booleans().map(str) | ANY_TEXT.filter(lambda t: not _numberish(t))
              | st.lists(st.integers(), max_size=2) | st.dictionaries(ANY_TEXT, st.integers(), max_size=2)
              | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f)))
NOT_A_STRING = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                | st.lists(ANY_TEXT, max_size=2) | st.dictionaries(ANY_TEXT, ANY_TEXT, max_size=2))

# (method, path, fields: name -> "int" | "str" (required), "int=" (has a default), "str?" (null allowed)) per endpoint
TEXTCRAFT_ENDPOINTS = [
    ("POST", "/reset", {"id": "int", "data_idx": "int="}),
    ("POST", "/step", {"id": "int", "action": "str"}),
    ("POST", "/close", {"id": "int"}),
    ("POST", "/create", {"commands": "str?", "goal": "str?"}),
    ("GET", "/observation", {"id": "int"}),
    ("GET", "/commands", {"id": "int"}),
    ("GET", "/goal", {"id": "int"}),
    ("GET", "/detail", {"id": "int"}),
]
SCIWORLD_ENDPOINTS = [   # /create starts a JVM: exercised once, by the fixture
    ("POST", "/reset", {"id": "int", "data_idx": "int="}),
    ("POST", "/step", {"id": "int", "action": "str"}),
    ("POST", "/close", {"id": "int"}),
    *[("GET", f"/{name}", {"id": "int"}) for name in
      ("observation", "action_hint", "goals", "detail", "task_description", "object_tree", "look_around",
       "inventory", "valid_action_object_combinations")],
]
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def textcraft():
    """A TextCraft server of this module's own (the fuzz creates and closes
    envs) and one live env on it."""
    proc, url = start_server("agentenv_servers.textcraft")
    env_id = requests.post(f"{url}/create", json={}).json()["id"]
    yield url, env_id
    stop_server(proc)


@pytest.fixture(scope="module")
def sciworld(sciworld_server):
    """The shared SciWorld server and one live env (one JVM) on it, closed at the end."""
    env_id = requests.post(f"{sciworld_server}/create", json={}, timeout=300).json()["id"]
    requests.post(f"{sciworld_server}/reset", json={"id": env_id, "data_idx": 0}, timeout=300).raise_for_status()
    yield sciworld_server, env_id
    requests.post(f"{sciworld_server}/close", json={"id": env_id})


def raw_json(value) -> bytes:
    """JSON bytes as a client would send them: a lone surrogate goes out as
    its \\uXXXX escape (valid JSON; the only way one can be sent)."""
    return json.dumps(value, ensure_ascii=True).encode()


def send(url: str, method: str, path: str, body: bytes | None = None, params: dict | None = None,
         content_type: str = "application/json") -> requests.Response:
    headers = {"content-type": content_type} if body is not None else {}
    return requests.request(method, url + path, data=body, params=params, headers=headers, timeout=120)


def strict(text: str):
    """Parse as strict JSON (no NaN/Infinity)."""
    def refuse(token):
        raise AssertionError(f"non-standard JSON constant {token}")
    return json.loads(text, parse_constant=refuse)


def check_answer(res: requests.Response) -> object:
    """The rules every answer follows; returns the parsed body."""
    assert res.status_code != 500 and res.status_code < 600, res.text[:500]
    assert res.headers.get("content-type", "").startswith("application/json"), (res.status_code, res.text[:300])
    data = strict(res.text)
    if res.status_code != 200:
        assert isinstance(data, dict) and isinstance(data.get("error"), str) and data["error"].strip(), data
    return data


def cleanup(url: str, path: str, data) -> None:
    if path == "/create" and isinstance(data, dict) and isinstance(data.get("id"), int):
        requests.post(f"{url}/close", json={"id": data["id"]})


def field_value(kind: str, env_id: int | None) -> st.SearchStrategy:
    """A well-formed value; ids are the live env's or random ones (None: never
    the live env's, so /close cannot end it under the other draws)."""
    if kind.startswith("int"):
        ids = st.integers(min_value=-2**70, max_value=2**70).filter(lambda i: i != env_id)
        return ids if env_id is None else st.sampled_from([env_id]) | ids
    text = ANY_TEXT.filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t))
    return (st.none() | text) if kind == "str?" else text


@st.composite
def requests_for(draw, endpoints, env_id: int):
    """(method, path, body bytes or None, query params or None, what is wrong:
    None, "surrogate", ("field", name), "json", "shape")."""
    method, path, fields = draw(st.sampled_from(endpoints))
    live = None if path == "/close" else env_id
    good = {name: draw(field_value(kind, live)) for name, kind in fields.items()}
    fault = draw(st.sampled_from(["none", "surrogate", "wrong type", "missing", "not json", "not an object"]))
    wrong = None
    if fault == "surrogate" and any(k.startswith("str") for k in fields.values()):
        name = draw(st.sampled_from([n for n, k in fields.items() if k.startswith("str")]))
        good[name], wrong = draw(TEXT_WITH_SURROGATE), "surrogate"
    elif fault == "wrong type":
        name = draw(st.sampled_from(sorted(fields)))
        good[name], wrong = draw(NOT_AN_INT if fields[name].startswith("int") else NOT_A_STRING.filter(
            lambda v: v is not None or fields[name] != "str?")), ("field", name)
    elif fault == "missing" and any(k in ("int", "str") for k in fields.values()):
        name = draw(st.sampled_from([n for n, k in fields.items() if k in ("int", "str")]))
        del good[name]
        wrong = ("field", name)
    if method == "GET":
        params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in good.items()}
        if wrong == "surrogate":
            wrong = None   # a query string is percent-encoded UTF-8: no surrogate can be sent
            params = {k: v.encode("utf-8", "replace").decode() for k, v in params.items()}
        return method, path, None, params, wrong
    if fault == "not json":
        return method, path, draw(st.binary(min_size=1, max_size=60).filter(lambda b: not _is_json(b))), None, "json"
    # The servers look for a lone surrogate anywhere in a JSON body before they
    # check its shape or fields: a body holding one is refused for that first.
    if fault == "not an object":
        value = draw(JSON_VALUES.filter(lambda v: not isinstance(v, dict)))
        return method, path, raw_json(value), None, "surrogate" if _has_surrogate(value) else "shape"
    extra = draw(st.dictionaries(ANY_TEXT.filter(lambda k: k not in fields), JSON_VALUES, max_size=2))
    body = {**extra, **good}
    if _has_surrogate(body):
        wrong = "surrogate"
    return method, path, raw_json(body), None, wrong


def _is_json(b: bytes) -> bool:
    try:
        json.loads(b)
        return True
    except ValueError:
        return False


def _has_surrogate(value) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def check_request(url: str, method: str, path: str, body, params, wrong) -> None:
    res = send(url, method, path, body, params)
    data = check_answer(res)
    cleanup(url, path, data)
    if wrong == "surrogate":
        assert res.status_code == 422 and "lone surrogate" in data["error"], data
    elif isinstance(wrong, tuple):
        named = (f"field {wrong[1]}", f"body.{wrong[1]}", f"parameter {wrong[1]}")
        assert res.status_code == 422 and any(n in data["error"] for n in named), data
    elif wrong == "json":
        assert res.status_code in (400, 422) and ("JSON" in data["error"] or "UTF-8" in data["error"]
                                                  or "utf-8" in data["error"]), data
    elif wrong == "shape":
        assert res.status_code == 422 and "JSON object" in data["error"], data


@FUZZ
@given(data=st.data())
def test_textcraft_answers_every_request_with_json(textcraft, data):
    """Any drawn request to the TextCraft server gets strict JSON, never a 500;
    a refusal names what was wrong."""
    url, env_id = textcraft
    check_request(url, *data.draw(requests_for(TEXTCRAFT_ENDPOINTS, env_id)))


@FUZZ
@given(data=st.data())
def test_sciworld_answers_every_request_with_json(sciworld, data):
    """Any drawn request to the SciWorld server gets strict JSON, never a 500;
    a refusal names what was wrong."""
    url, env_id = sciworld
    check_request(url, *data.draw(requests_for(SCIWORLD_ENDPOINTS, env_id)))


@pytest.mark.parametrize("server", ["textcraft", "sciworld"])
def test_lone_surrogate_action_gets_a_json_error_naming_it(server, request):
    """The case a new user hit: a step whose action holds "\\ud800" (valid
    JSON, not valid Unicode) got a bare "500 Internal Server Error"."""
    url, env_id = request.getfixturevalue(server)
    check_answer(send(url, "POST", "/reset", raw_json({"id": env_id, "data_idx": 0})))   # a fresh episode
    res = send(url, "POST", "/step", b'{"id": %d, "action": "get 1 \\ud800 stick"}' % env_id)
    data = check_answer(res)
    assert res.status_code == 422
    assert "action" in data["error"] and "lone surrogate" in data["error"] and "\\ud800" in data["error"]
    # the env is unharmed: a good step right after works
    ok = send(url, "POST", "/step", raw_json({"id": env_id, "action": "look around" if server == "sciworld"
                                              else "inventory"}))
    assert ok.status_code == 200 and "observation" in check_answer(ok)


@pytest.mark.parametrize("server", ["textcraft", "sciworld"])
@pytest.mark.parametrize("method,path,body,needle", [
    ("POST", "/step", b"not json", "not valid JSON"),
    ("POST", "/step", b'{"id": 1', "not valid JSON"),
    ("POST", "/step", b'{"id": "x", "action": "a"}', "body field id"),
    ("POST", "/step", b'{"id": 1}', "body field action is missing"),
    ("POST", "/step", b'{"id": 1, "action": null}', "body field action"),
    ("POST", "/step", b"[1, 2]", "must be a JSON object"),
    ("POST", "/reset", b'{"id": 1, "data_idx": 1e308}', "body field data_idx"),
    ("POST", "/step", b'{"id": 1, "action": "\xff\xfe"}', "UnicodeDecodeError"),
    ("GET", "/observation", None, "query parameter id is missing"),
    ("PUT", "/step", b"{}", "does not take PUT"),
    ("GET", "/no_such_endpoint", None, "no endpoint /no_such_endpoint"),
])
def test_named_malformed_requests(server, method, path, body, needle, request):
    """Each known kind of bad request (not JSON, wrong field type, missing
    field, not an object, bad UTF-8, wrong method, unknown path) gets a 4xx
    JSON error naming it."""
    url, _ = request.getfixturevalue(server)
    res = send(url, method, path, body)
    data = check_answer(res)
    assert res.status_code in (400, 404, 405, 422) and needle in data["error"], data


def test_error_bodies_are_finite_json():
    """The error renderer itself: a lone surrogate quoted back is escaped,
    never a crash; NaN is refused (strict JSON)."""
    from agentenv_servers.common import SafeJSONResponse

    assert json.loads(SafeJSONResponse({"error": "bad \ud800"}).body) == {"error": "bad \ud800"}
    with pytest.raises(ValueError):
        SafeJSONResponse({"x": math.nan})
