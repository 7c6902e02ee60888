#!/usr/bin/env bash
# One-command Agent-R demo on the bundled TextCraft server and tiny model:
# search (MCTS) -> revision data -> XTuner export -> evaluation. It only sets
# defaults: with MODEL_DIR=/path/to/Llama-3.1-8B-Instruct (and a GPU backend)
# the very same scripts do the real run. See docs/demo.md.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
OUT=${DEMO_OUT:-demo_output}
DEMO_MIN=${DEMO_MIN:-0}                 # train task indices searched: [DEMO_MIN, DEMO_MAX)
DEMO_MAX=${DEMO_MAX:-10}
DEMO_EVAL_LIMIT=${DEMO_EVAL_LIMIT:-20}  # first N test tasks (empty = the whole 100-task split)
export TASK=textcraft
export ITERA=${ITERA:-4} N_GEN=${N_GEN:-4} MAX_DEPTH=${MAX_DEPTH:-12} TEMP=${TEMP:-1.0}
export MAX_TOKEN_LENGTH=${MAX_TOKEN_LENGTH:-2048}
export LOGLEVEL=${LOGLEVEL:-WARNING}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-100}   # the tiny model's turns are ~25 tokens
EVAL_TEMP=${EVAL_TEMP:-0}
EVAL_MAX_STEPS=${EVAL_MAX_STEPS:-15}   # expert plans of the first test tasks need <= 6

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

MODEL_NAME=${MODEL_NAME:-$(basename "${MODEL_DIR:-textcraft-tiny}")}
export MODEL_NAME
echo "== 1/4 MCTS search on train tasks [$DEMO_MIN, $DEMO_MAX) (ITERA=$ITERA N_GEN=$N_GEN MAX_DEPTH=$MAX_DEPTH TEMP=$TEMP)"
"$PY" mcts_collection.py --env_server_base "$URL" --min "$DEMO_MIN" --max "$DEMO_MAX" \
    --output_dir "$OUT/mcts_result" --max_new_tokens "$MAX_NEW_TOKENS"

echo "== 2/4 revision data (the model verifies its own bad paths) and good data"
"$PY" path_collection.py --input_dir "$OUT/mcts_result/$TASK/$MODEL_NAME" --output_dir "$OUT/mcts_training_data" \
    --data_type centric --revise 1 --max_new_tokens "$MAX_NEW_TOKENS"
"$PY" path_collection.py --input_dir "$OUT/mcts_result/$TASK/$MODEL_NAME" --output_dir "$OUT/mcts_training_data" \
    --data_type good
"$PY" path_collection.py export --format xtuner --input "$OUT/mcts_training_data/${TASK}_centric.jsonl" \
    "$OUT/mcts_training_data/${TASK}_good.jsonl" --output "$OUT/xtuner_train.json"

echo "== 3/4 evaluation on the test split (TEMP=$EVAL_TEMP, ${DEMO_EVAL_LIMIT:-all} tasks, max $EVAL_MAX_STEPS steps)"
TEMP=$EVAL_TEMP "$PY" eval.py --env_server_base "$URL" --output_dir "$OUT/test_result" \
    --max_new_tokens "$MAX_NEW_TOKENS" --max_steps "$EVAL_MAX_STEPS" ${DEMO_EVAL_LIMIT:+--limit "$DEMO_EVAL_LIMIT"}

echo "== 4/4 what the demo made"
"$PY" -m scripts.demo_summary "$OUT" --task "$TASK" --model_name "$MODEL_NAME"
