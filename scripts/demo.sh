#!/usr/bin/env bash
# One-command Agent-R demo: one short self-training iteration through iterate.py
# on the bundled TextCraft server and the self-training base model
# models/textcraft-base (taught a third of the train split only): evaluate the
# base model, search (MCTS) on train tasks it was never taught, revision data
# (the model judges its own bad paths) and good data, a short CPU fine-tune, and
# the new model's evaluation beside the base. It only sets defaults: with
# MODEL_DIR=/path/to/Llama-3.1-8B-Instruct on a GPU (vllm backend, XTuner
# trainer) the very same command does the real run. See docs/demo.md and
# docs/iterate.md.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
OUT=${DEMO_OUT:-demo_output}
NAME=${DEMO_NAME:-demo}
export MODEL_DIR=${MODEL_DIR:-models/textcraft-base}
# Which train tasks are searched: DEMO_SEARCH_TASKS of those MODEL_DIR was not
# taught (its training_tasks.json), spread over the recipe depths
# (python -m agent_r.loop.search_tasks, seeded); or, when DEMO_MIN or DEMO_MAX
# is set, the train task indices [DEMO_MIN, DEMO_MAX) (the loop still leaves out
# the taught ones, and stops with one line if none is left).
DEMO_SEARCH_TASKS=${DEMO_SEARCH_TASKS:-10}
DEMO_MIN=${DEMO_MIN:-}
DEMO_MAX=${DEMO_MAX:-}
DEMO_EVAL_LIMIT=${DEMO_EVAL_LIMIT:-20}  # first N test tasks (empty = the whole 100-task split)
export TASK=textcraft
export ITERATIONS=${ITERATIONS:-1} VARIANTS=${VARIANTS:-agent-r}
export ITERA=${ITERA:-4} N_GEN=${N_GEN:-4} MAX_DEPTH=${MAX_DEPTH:-12} TEMP=${TEMP:-1.0}
export MAX_TOKEN_LENGTH=${MAX_TOKEN_LENGTH:-2048}
export EPOCHS=${EPOCHS:-2} LR=${LR:-1e-4} ACCUMULATIVE_COUNTS=${ACCUMULATIVE_COUNTS:-1} WARMUP_RATIO=${WARMUP_RATIO:-0}
export EVAL_TEMP=${EVAL_TEMP:-0}
export LOGLEVEL=${LOGLEVEL:-WARNING}
# A 3M-parameter model gains little from a second thread, and spinning threads
# cost much on a shared machine.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-60}    # the base model's turns are ~25 tokens; also caps its verifier replies
EVAL_MAX_STEPS=${EVAL_MAX_STEPS:-12}    # expert plans of the first test tasks need <= 6
REVISE_LIMIT=${REVISE_LIMIT:-5}         # revision task: 5 of the base model's failed test episodes, cut at random
REVISE_MAX_STEPS=${REVISE_MAX_STEPS:-$EVAL_MAX_STEPS}   # turns after the cut
CONCURRENCY=${CONCURRENCY:-16}          # trees / episodes whose model turns share one batched call
MAX_PAIRS_PER_TREE=${MAX_PAIRS_PER_TREE:-4}  # revision pairs per tree (0 = all, the reference; many repeat one good path)

if [ "${SKIP_SETUP:-0}" != 1 ]; then make -s setup; fi
mkdir -p "$OUT"

# Local TextCraft server on a free port; stopped on exit, also on failure or Ctrl-C.
PORT=${DEMO_PORT:-$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
URL="http://127.0.0.1:$PORT"
"$PY" -m agentenv_servers.textcraft --port "$PORT" > "$OUT/textcraft_server.log" 2>&1 &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true' EXIT
"$PY" - "$URL" <<'PYEOF'
import sys, time, requests
for _ in range(300):
    try:
        if requests.get(sys.argv[1] + "/health", timeout=2).ok:
            sys.exit(0)
    except requests.RequestException:
        time.sleep(0.2)
sys.exit(f"the TextCraft server at {sys.argv[1]} did not start; see its log in the demo folder")
PYEOF
echo "== TextCraft server on $URL"

if [ -n "$DEMO_MIN$DEMO_MAX" ]; then
    SEARCH=(--min "${DEMO_MIN:-0}" ${DEMO_MAX:+--max "$DEMO_MAX"})
    SEARCHED="train tasks [${DEMO_MIN:-0}, ${DEMO_MAX:-end}) less those $MODEL_DIR was taught"
else
    TASK_LIST="$OUT/search_tasks_$NAME.json"
    "$PY" -m agent_r.loop.search_tasks --model_dir "$MODEL_DIR" --n "$DEMO_SEARCH_TASKS" --out "$TASK_LIST"
    SEARCH=(--split_file "$TASK_LIST")
    SEARCHED="$DEMO_SEARCH_TASKS train tasks $MODEL_DIR was not taught"
fi

echo "== iterate.py: base eval, then $ITERATIONS iteration(s) of search on $SEARCHED" \
     "(ITERA=$ITERA N_GEN=$N_GEN MAX_DEPTH=$MAX_DEPTH) -> revision + good data -> fine-tune" \
     "(EPOCHS=$EPOCHS LR=$LR) -> eval on ${DEMO_EVAL_LIMIT:-all} test tasks"
"$PY" iterate.py --name "$NAME" --runs_dir "$OUT" --env_server_base "$URL" "${SEARCH[@]}" \
    --max_new_tokens "$MAX_NEW_TOKENS" --eval_max_steps "$EVAL_MAX_STEPS" --revise_limit "$REVISE_LIMIT" \
    --revise_max_steps "$REVISE_MAX_STEPS" \
    --concurrency "$CONCURRENCY" --max_pairs_per_tree "$MAX_PAIRS_PER_TREE" \
    ${DEMO_EVAL_LIMIT:+--eval_limit "$DEMO_EVAL_LIMIT"}

echo "== what the demo made"
"$PY" -m scripts.demo_summary "$OUT/$NAME"

# Pages to look at the first search in a browser (docs/viewer.md), agent-r's revision pairs marked.
REVISIONS=("$OUT/$NAME"/iter_1/data/agent-r/*_centric.jsonl)
[ -e "${REVISIONS[0]}" ] && REVISIONS=(--revisions "${REVISIONS[@]}") || REVISIONS=()
echo "== tree viewer"
"$PY" -m agent_r.view "$OUT/$NAME/iter_1/trees" ${REVISIONS[@]+"${REVISIONS[@]}"} -o "$OUT/$NAME/viewer"
echo "open $OUT/$NAME/viewer/index.html in a browser (one page per tree under $OUT/$NAME/viewer/)"
