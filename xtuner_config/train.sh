#!/usr/bin/env bash
# Agent-R training: full fine-tune with XTuner (+ DeepSpeed), then convert the
# final checkpoint to a Hugging Face model directory for the next iteration.
#
#   DATA_FILES=train.json MODEL_DIR=/models/Llama-3.1-8B-Instruct NPROC_PER_NODE=8 \
#       bash xtuner_config/train.sh [extra `xtuner train` arguments...]
#
# Launch: NPROC_PER_NODE, NNODES, NODE_RANK, ADDR, PORT as for `xtuner train`
# (torchrun when more than one process). The repository is put on PYTHONPATH
# (the config imports agent_r). Settings: the config's environment variables
# (docs/training.md), plus
#   CONFIG      config file            (xtuner_config/agent_r_llama3_8b_full.py)
#   DEEPSPEED   XTuner DeepSpeed name or JSON path, "none" to train without
#               DeepSpeed                             (deepspeed_zero2)
#   WORK_DIR    logs and checkpoints   (work_dirs/<config name>)
#   HF_DIR      converted model        ($WORK_DIR/hf)
#   SAVE_FP32   1 = save the converted model in fp32 instead of fp16 (0)
#
# A rerun resumes from WORK_DIR's last checkpoint. The `xtuner` command drops
# its tools' exit status, so this script runs XTuner's train and pth_to_hf
# tools itself, with the arguments `xtuner train` / `xtuner convert` pass.
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The config imports agent_r (its settings and data loaders): the repository
# goes first on the import path of every process started below.
export PYTHONPATH="$(dirname "$HERE")${PYTHONPATH:+:$PYTHONPATH}"
CONFIG="${CONFIG:-$HERE/agent_r_llama3_8b_full.py}"
DEEPSPEED="${DEEPSPEED:-deepspeed_zero2}"
NPROC_PER_NODE="${NPROC_PER_NODE:-1}"
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
ADDR="${ADDR:-127.0.0.1}"
PORT="${PORT:-29500}"
SAVE_FP32="${SAVE_FP32:-0}"

[[ -f "$CONFIG" ]] || die "CONFIG=$CONFIG does not exist: point it at an XTuner config file"
[[ -n "${DATA_FILES:-}" ]] || die "DATA_FILES is not set: it is the comma-separated JSON files from \`python path_collection.py export --format xtuner\`. Set it, e.g. \`export DATA_FILES=train.json\`."
for n in NPROC_PER_NODE NNODES NODE_RANK PORT; do
    [[ "${!n}" =~ ^[0-9]+$ ]] || die "$n=${!n} is not a non-negative integer"
done
command -v python >/dev/null && python -c "import xtuner" 2>/dev/null \
    || die "XTuner is not importable by \`python\`: activate the training environment (make setup-train; source .venv-train/bin/activate)"

config_name="$(basename "$CONFIG" .py)"
export WORK_DIR="${WORK_DIR:-work_dirs/$config_name}"
WORK_DIR="$(mkdir -p "$WORK_DIR" && cd "$WORK_DIR" && pwd)"
HF_DIR="${HF_DIR:-$WORK_DIR/hf}"

args=("$CONFIG" --work-dir "$WORK_DIR")
if [[ "$DEEPSPEED" != "none" && -n "$DEEPSPEED" ]]; then
    args+=(--deepspeed "$DEEPSPEED")
fi
if [[ -s "$WORK_DIR/last_checkpoint" ]]; then
    resume_from="$(cat "$WORK_DIR/last_checkpoint")"
    echo "resuming from $resume_from"
    args+=(--resume "$resume_from")
    # XTuner and mmengine read their own checkpoints with torch.load's old
    # default; torch >= 2.6 refuses them unless told to (they are ours: trusted).
    export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
fi

if (( NPROC_PER_NODE * NNODES > 1 )); then
    torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" \
        --master_addr="$ADDR" --master_port="$PORT" \
        -m xtuner.tools.train "${args[@]}" "$@" --launcher pytorch
else
    # DeepSpeed wants a process group even for a single process.
    export RANK="${RANK:-0}" LOCAL_RANK="${LOCAL_RANK:-0}" WORLD_SIZE="${WORLD_SIZE:-1}" \
        LOCAL_WORLD_SIZE="${LOCAL_WORLD_SIZE:-1}" MASTER_ADDR="${MASTER_ADDR:-$ADDR}" \
        MASTER_PORT="${MASTER_PORT:-$PORT}"
    python -m xtuner.tools.train "${args[@]}" "$@"
fi

if (( NODE_RANK != 0 )); then
    echo "node $NODE_RANK done; node 0 converts the checkpoint"
    exit 0
fi
[[ -s "$WORK_DIR/last_checkpoint" ]] || { echo "error: training wrote no checkpoint in $WORK_DIR" >&2; exit 1; }
pth="$(cat "$WORK_DIR/last_checkpoint")"

convert=("$CONFIG" "$pth" "$HF_DIR.tmp" --safe-serialization)
[[ "$SAVE_FP32" == 1 ]] && convert+=(--fp32)
rm -rf "$HF_DIR.tmp"
python -m xtuner.tools.model_converters.pth_to_hf "${convert[@]}"
# pth_to_hf loads a DeepSpeed checkpoint one tensor per name, which unties a
# tied embedding/LM head (written twice), and keeps the base config's `dtype`
# next to its own `torch_dtype`: save the tied weights once, name one dtype.
python -m agent_r.training.tied "$HF_DIR.tmp"
# Replace the old model only once the new one is complete.
rm -rf "$HF_DIR.old"
[[ -e "$HF_DIR" ]] && mv "$HF_DIR" "$HF_DIR.old"
mv "$HF_DIR.tmp" "$HF_DIR"
rm -rf "$HF_DIR.old"

echo "trained checkpoint: $pth"
echo "Hugging Face model: $HF_DIR"
echo "next iteration: export MODEL_DIR=$HF_DIR"
