# Sourced by the reproduction scripts: start_textcraft_server LOG starts the bundled
# TextCraft server on a free local port with $PY, sets URL and SERVER_PID, stops it at
# exit, and waits (up to 30 s) until it answers.
start_textcraft_server() {
  PORT=${PORT:-$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
  URL="http://127.0.0.1:$PORT"
  "$PY" -m agentenv_servers.textcraft --port "$PORT" > "$1" 2>&1 &
  SERVER_PID=$!
  trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT
  for _ in $(seq 150); do curl -sf "$URL/health" >/dev/null 2>&1 && break; sleep 0.2; done
}
