"""HTTP servers in this process for the client tests: a TCP front that drops
connections or answers 503 before passing requests to a real server, and a
server of canned JSON answers that records what each client sent."""
from __future__ import annotations

import http.server
import json
import threading

import requests


class DroppingFront:
    """Accepts connections; the first ``drops`` are closed without an answer
    (the client sees a ConnectionError), later ones are forwarded to
    ``target``; ``busy`` more after those are answered 503. Counts every
    connection."""

    def __init__(self, target: str, drops: int, busy: int = 0):
        self.target, self.drops, self.busy, self.seen = target, drops, busy, 0
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"   # one request per connection: each attempt is a new one

            def log_message(self, *args):
                pass

            def handle_one_request(self):
                self.raw_requestline = self.rfile.readline(65537)
                if not self.raw_requestline or not self.parse_request():
                    return
                front.seen += 1
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if front.seen <= front.drops:
                    self.close_connection = True   # hang up: no status line at all
                    return
                if front.seen <= front.drops + front.busy:
                    self.send_response(503)
                    self.end_headers()
                    return
                res = requests.request(self.command, front.target + self.path, data=body,
                                       headers={"content-type": self.headers.get("content-type", "")}, timeout=30)
                self.send_response(res.status_code)
                self.send_header("content-type", res.headers.get("content-type", "application/json"))
                self.send_header("content-length", str(len(res.content)))
                self.end_headers()
                self.wfile.write(res.content)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class CannedServer:
    """Answers each path with a fixed JSON value (a dict of path -> value,
    changeable between requests) and records every request as (method, path,
    query, JSON body)."""

    def __init__(self, answers: dict):
        self.answers, self.seen = answers, []
        canned = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self):
                path, _, query = self.path.partition("?")
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                canned.seen.append((self.command, path, query, json.loads(raw) if raw else None))
                if path not in canned.answers:
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.dumps(canned.answers[path]).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
