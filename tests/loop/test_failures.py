"""A stage with an item that failed for good is never marked finished: the
loop stops with exit code 1, and rerunning the same command retries exactly
that item (finished items are kept). Here an eval episode: the env server
answers every reset of one test task with an error, as AgentGym servers
report failures (HTTP 200 with ``{"error": ...}``)."""
from __future__ import annotations

import http.server
import json
import threading
from collections import Counter
import pytest
import requests

from agent_r.evaluation import is_complete
from agent_r.loop import run
from agent_r.loop.stages import MARKER
from tests.loop.conftest import SMALL, settings_for


class FailingProxy:
    """The real server behind a proxy that, while ``failing`` is set, answers
    every reset of the first task it is asked to reset with an env error."""

    def __init__(self, upstream: str):
        self.upstream, self.failing, self.bad = upstream.rstrip("/"), True, None
        self.resets: Counter = Counter()
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                self.forward(b"")

            def do_POST(self):  # noqa: N802
                self.forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def forward(self, body: bytes) -> None:
                if self.path == "/reset":
                    idx = json.loads(body)["data_idx"]
                    with proxy.lock:
                        proxy.resets[idx] += 1
                        proxy.bad = idx if proxy.bad is None else proxy.bad
                        planted = proxy.failing and idx == proxy.bad
                    if planted:
                        return self.reply(200, json.dumps({"error": f"planted failure of task {idx}"}).encode())
                got = requests.request(self.command, proxy.upstream + self.path, data=body or None, timeout=60,
                                       headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
                self.reply(got.status_code, got.content)

            def reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(textcraft_server):
    p = FailingProxy(textcraft_server)
    yield p
    p.close()


def test_an_eval_episode_that_failed_for_good_leaves_the_stage_unfinished_and_a_rerun_retries_it(
        proxy, base_model, tmp_path):
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "ITERATIONS": "0"}
    flags = ["--eval_limit", "2", "--eval_max_steps", "2", "--revise_limit", "0", "--max_new_tokens", "40",
             "--concurrency", "1", "--env_server_base", proxy.url, "--runs_dir", str(tmp_path), "--name", "faulty"]
    stage = tmp_path / "faulty" / "iter_0" / "eval" / "base"
    results = stage / "textcraft" / "base_test"

    first = run(settings_for(env, flags))
    assert first.exit_code == 1 and "eval of textcraft" in first.incomplete and "rerun" in first.incomplete
    assert proxy.bad is not None and proxy.resets[proxy.bad] >= 2          # tried, and retried on a fresh env
    assert not (stage / MARKER).exists()                                   # never marked finished
    assert not (tmp_path / "faulty" / "results.json").exists()
    failed = results / f"search_results_{proxy.bad}.json"
    assert not is_complete(failed)                                         # recorded as an error, to retry
    kept = {p.name: p.stat().st_mtime_ns for p in results.glob("search_results_*.json") if p != failed}
    assert len(kept) == 1 and all(is_complete(results / name) for name in kept)

    proxy.failing = False
    before = Counter(proxy.resets)
    second = run(settings_for(env, flags))
    assert second.exit_code == 0, second.incomplete
    assert proxy.resets[proxy.bad] > before[proxy.bad]                     # the failed task is retried ...
    assert {idx: n - before[idx] for idx, n in proxy.resets.items() if n > before[idx]} == {
        proxy.bad: proxy.resets[proxy.bad] - before[proxy.bad]}            # ... and only it
    assert {p.name: p.stat().st_mtime_ns for p in results.glob("search_results_*.json") if p.name in kept} == kept
    assert is_complete(failed)
    done = json.loads((stage / MARKER).read_text())
    assert done["stage"] == "eval" and done["stats"]["test"]["textcraft"]["tasks"] == 2
    rows = json.loads((tmp_path / "faulty" / "results.json").read_text())["rows"]
    assert [(r["iteration"], r["variant"]) for r in rows] == [(0, "base")]
