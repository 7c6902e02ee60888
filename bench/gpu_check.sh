#!/usr/bin/env bash
# Driver for bench/bench_gpu.py: the GPU checks (hf backend throughput, the
# pipeline with --backend hf, XTuner ZeRO-2 training) on random-weight Llama
# models built from a config. Run from the repository root (or a snapshot of it).
#
#   PARTS=throughput bash bench/gpu_check.sh          # info, build 1b + 8b, throughput
#   PARTS=pipeline,train,prewarm bash bench/gpu_check.sh   # info, build 1b, pipeline, XTuner,
#                                                           # throughput with a pre-filled allocator
#
# CPU smoke test with tiny settings (uses .venv / .venv-train and the CPU shims
# the tests use):
#   LOCAL=1 PARTS=throughput,pipeline,train bash bench/gpu_check.sh
#   LOCAL=1 PARTS=throughput,replay bash bench/gpu_check.sh   # the search ratio's replay and profile
#
# Variables: OUT (results + logs; default /tmp/gpu_out), PARTS, BUDGET_S (seconds
# before later steps are skipped, default 540), WHL / WHL_TRAIN (wheel folders
# installed with pip --target /tmp/site and /tmp/site-train when present).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}
PARTS=${PARTS:-throughput}
WORK=${WORK:-/tmp/bench_gpu}
mkdir -p "$OUT" "$WORK/logs"
RES="$OUT/gpu_results.json"
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-540} ))
has() { [[ ",$PARTS," == *",$1,"* ]]; }

if [[ "${LOCAL:-0}" == 1 ]]; then
    PY=${PY:-.venv/bin/python}
    TRAIN_PY=${TRAIN_PY:-$(pwd)/.venv-train/bin/python}
    TRAIN_PYTHONPATH=$(pwd)/tests/training/support
    TRAIN_ARGS=(--config "$(pwd)/tests/training/cpu_config.py" --deepspeed "$(pwd)/tests/training/support/deepspeed_zero2_cpu.json"
                --max_length 512)
    SHAPES=${SHAPES:-tiny}
    TP_ARGS=(--batches 4,8 --max_new_tokens 8 --repeats 1)
    PREWARM_BATCHES=${PREWARM_BATCHES:-4}
    PIPE_ARGS=(--mcts_max 3 --tiny_max 4 --tiny_eval_limit 4 --eval_max_steps 3 --max_new_tokens 16)
    export OMP_NUM_THREADS=1
else
    PY=${PY:-python3}
    TRAIN_PY=${TRAIN_PY:-$(command -v python3)}
    TRAIN_PYTHONPATH=/tmp/site-train:/tmp/site
    TRAIN_ARGS=()
    SHAPES=${SHAPES:-1b,8b}
    TP_ARGS=()
    PIPE_ARGS=(--tiny_max 12 --tiny_eval_limit 30 --eval_max_steps 5)
fi

WHL=${WHL:-../whl}
WHL_TRAIN=${WHL_TRAIN:-../whl-train}
if [[ -d "$WHL" ]]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl || exit 3
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if has train && [[ -d "$WHL_TRAIN" ]]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-train "$WHL_TRAIN"/*.whl || exit 3
fi

# as a module of the bench package: the repository root is then on sys.path (agent_r, agentenv_*)
B=(-m bench.bench_gpu --results "$RES" --deadline "$DEADLINE" --workdir "$WORK" --logdir "$WORK/logs")
echo "== info"
$PY "${B[@]}" info

# Local TextCraft server (stopped on exit)
$PY -m agentenv_servers.textcraft --port 36001 > "$WORK/logs/textcraft_server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 100); do
    $PY -c 'import requests,sys; sys.exit(0 if requests.get("http://127.0.0.1:36001/health",timeout=2).ok else 1)' 2>/dev/null && break
    sleep 0.3
done

for shape in ${SHAPES//,/ }; do
    if [[ "$shape" != "1b" && "$shape" != "tiny" ]] && ! has throughput; then continue; fi
    echo "== build $shape"
    $PY "${B[@]}" build --shape "$shape" --out "/tmp/models/random-$shape" || echo "build $shape failed: $?"
done
SMALL=/tmp/models/random-$([[ "${LOCAL:-0}" == 1 ]] && echo tiny || echo 1b)

if has throughput; then
    for shape in ${SHAPES//,/ }; do
        echo "== throughput $shape"
        $PY "${B[@]}" throughput --model "/tmp/models/random-$shape" --label "$shape" "${TP_ARGS[@]}" \
            --record_dir "$WORK/calls" || echo "throughput $shape failed: $?"
    done
fi
if has replay; then
    # the search's recorded calls again in a fresh process: slow too -> the inputs, fast -> the process
    for shape in ${SHAPES//,/ }; do
        for calls in "$WORK"/calls/calls_"$shape"_B*.jsonl; do
            [[ -f "$calls" ]] || continue
            echo "== replay $calls"
            $PY "${B[@]}" replay --model "/tmp/models/random-$shape" --calls "$calls" \
                --label "${shape}_$(basename "$calls" .jsonl)" --profile_call "${PROFILE_CALL:-3}" \
                || echo "replay $calls failed: $?"
        done
    done
fi
DATA_STEPS=${DATA_STEPS:-mcts_tiny,centric_tiny_trees_1b_verifier,good_tiny_trees,export_tiny_trees,mcts_1b,centric_1b_trees,good_1b_trees,export_1b_trees,eval_1b}
REST_STEPS=${REST_STEPS:-eval_tiny_default_dtype,eval_tiny_fp32}
if has pipeline; then
    echo "== pipeline (search, revision data, export, eval of the 1b model)"
    $PY "${B[@]}" pipeline --model "$SMALL" --fresh --steps "$DATA_STEPS" "${PIPE_ARGS[@]}" \
        --deadline $(( $(date +%s) + ${PIPE_A_S:-260} )) || echo "pipeline failed: $?"
fi
if has train; then
    echo "== train"
    $PY "${B[@]}" train --model "$SMALL" --data "$WORK/pipeline/train.json" --train_python "$TRAIN_PY" \
        --train_pythonpath "$TRAIN_PYTHONPATH" --collect_python "$(command -v $PY || echo $PY)" "${TRAIN_ARGS[@]}" \
        || echo "train failed: $?"
fi
if has prewarm; then
    # the same throughput check with PyTorch's caching allocator filled first
    echo "== throughput with a pre-filled CUDA caching allocator"
    $PY "${B[@]}" throughput --model "$SMALL" --label "small_prewarm" --prewarm_gib "${PREWARM_GIB:-40}" \
        "${TP_ARGS[@]}" --batches "${PREWARM_BATCHES:-16}" ${DIAGNOSE:+--diagnose} || echo "throughput prewarm failed: $?"
fi
if has pipeline; then
    echo "== pipeline (bundled model: default dtype vs fp32 on the GPU)"
    $PY "${B[@]}" pipeline --model "$SMALL" --steps "$REST_STEPS" "${PIPE_ARGS[@]}" || echo "pipeline failed: $?"
fi
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs $(cd "$WORK" && ls -d pipeline/*/textcraft/*/manifest.json pipeline/test_result \
    trace_*.json.gz 2>/dev/null) 2>/dev/null
echo "== results: $RES"
cat "$RES" | head -c 20000
