#!/usr/bin/env bash
# The first full CPU reproduction of Agent-R's self-training claim, with the
# bundled model on TextCraft (the paper's regime is reproduction/reproduce_paper.sh): base eval on all 100 test tasks, then ITERATIONS
# iterations of agent-r, direct and good, greedy eval after each. The results
# are in bench/RESULTS.md, "Self-training reproduction".
#
# It is iterate.py, spread over the cores: the base eval runs beside the
# first search, split in SHARDS shards by mcts_collection.py into the folder
# iterate.py reads (iter_1/trees/base/textcraft/base: iterate.py names a
# model's folders by its label, "base" for MODEL_DIR); then one iterate.py per
# variant (each owns its variant's folders); then one iterate.py with every
# variant that finds all stages done and writes results.{json,md,png}.
# Rerunning resumes.
# One process alone runs the same stages: `make reproduce` style, just slower.
#
#   bash reproduction/reproduce_full.sh                 # about 75 min on 2 idle cores
#   TRAIN_TASKS=4 EVAL_LIMIT=5 ITERATIONS=1 NAME=smoke bash reproduction/reproduce_full.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs}
NAME=${NAME:-repro_full}
TRAIN_TASKS=${TRAIN_TASKS:-40}   # spread evenly over the 444-task train split (and so over its depths)
SHARDS=${SHARDS:-2}              # processes searching iteration 1 beside the base eval
EVAL_LIMIT=${EVAL_LIMIT:-}       # empty: all 100 test tasks
export TASK=textcraft MODEL_DIR=${MODEL_DIR:-models/textcraft-tiny}
export ITERATIONS=${ITERATIONS:-2} ITERA=${ITERA:-4} N_GEN=${N_GEN:-4} MAX_DEPTH=${MAX_DEPTH:-10} TEMP=${TEMP:-1.0}
export TRAINER=${TRAINER:-cpu} EPOCHS=${EPOCHS:-3} LR=${LR:-1e-4} ACCUMULATIVE_COUNTS=${ACCUMULATIVE_COUNTS:-1}
export BATCH_SIZE=${BATCH_SIZE:-1} MAX_LENGTH=${MAX_LENGTH:-2048} WARMUP_RATIO=${WARMUP_RATIO:-0}
export EVAL_TEMP=${EVAL_TEMP:-0} LOGLEVEL=${LOGLEVEL:-INFO} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
VARIANT_LIST=${VARIANTS:-agent-r,direct,good}
unset VARIANTS

mkdir -p "$RUNS/$NAME"
SPLIT="$RUNS/$NAME/train_tasks.json"
"$PY" - "$SPLIT" "$TRAIN_TASKS" <<'PYEOF'
import json, sys
from pathlib import Path
train = json.loads(Path("agent_r/splits/textcraft_train.json").read_text())
n = int(sys.argv[2])
step = max(1, len(train) // n)
Path(sys.argv[1]).write_text(json.dumps(train[::step][:n]))
PYEOF

. reproduction/textcraft_server.sh
start_textcraft_server "$RUNS/$NAME/textcraft_server.log"

LOOP=(iterate.py --name "$NAME" --runs_dir "$RUNS" --env_server_base "$URL" --split_file "$SPLIT"
      --max_pairs_per_tree 4 --max_new_tokens 60 --concurrency 32 --hf_batch_size 32
      --eval_max_steps 12 --revise_limit 10 --revise_max_steps 12 --backend hf ${EVAL_LIMIT:+--eval_limit "$EVAL_LIMIT"})
LOGS="$RUNS/$NAME/logs"
mkdir -p "$LOGS"

echo "== 1: base eval beside the iteration-1 search of $TRAIN_TASKS train tasks in $SHARDS shards (logs: $LOGS)"
pids=()
ITERATIONS=0 VARIANTS=agent-r "$PY" "${LOOP[@]}" > "$LOGS/base_eval.log" 2>&1 & pids+=($!)
for ((i = 0; i < SHARDS; i++)); do
  "$PY" mcts_collection.py --output_dir "$RUNS/$NAME/iter_1/trees/base" --env_server_base "$URL" \
      --split_file "$SPLIT" --max_new_tokens 60 --concurrency 32 --hf_batch_size 32 --backend hf --model_name base \
      --shard_index "$i" --num_shards "$SHARDS" > "$LOGS/search_shard$i.log" 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done   # a failed item is retried by the runs below

echo "== 2: $ITERATIONS iteration(s) of each variant ($VARIANT_LIST), one process each"
pids=()
for v in ${VARIANT_LIST//,/ }; do
  VARIANTS=$v "$PY" "${LOOP[@]}" > "$LOGS/variant_$v.log" 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done

echo "== 3: all variants together (finished stages are only read back)"
VARIANTS=$VARIANT_LIST "$PY" "${LOOP[@]}"
