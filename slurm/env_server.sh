# Sourced by the sbatch scripts: an environment server for $TASK next to this
# job, on a free port (array tasks may share a node), stopped when the job
# ends. ENV_SERVER set (a URL: AgentGym's WebShop server, a shared server)
# skips it. Sets ENV_SERVER.
if [[ -z "${ENV_SERVER:-}" ]]; then
    _port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    python -m "agentenv_servers.${TASK%%,*}" --port "$_port" > "${TMPDIR:-/tmp}/agent-r-env-$SLURM_JOB_ID-$_port.log" 2>&1 &
    _server=$!
    trap 'kill $_server 2>/dev/null' EXIT
    ENV_SERVER="http://127.0.0.1:$_port"
    until python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/identity', timeout=2)" "$ENV_SERVER" 2>/dev/null; do
        kill -0 "$_server" 2>/dev/null || { echo "error: the $TASK server did not start (log in ${TMPDIR:-/tmp})" >&2; exit 2; }
        sleep 1
    done
fi
