#!/usr/bin/env bash
# Data-parallel search or eval on one node: one process per GPU (or per group of
# GPUS_PER_SHARD GPUs, for tensor parallel), each a shard of the same run, all
# writing into the same output folder (docs/cluster.md).
#
#   bash scripts/launch_shards.sh python mcts_collection.py --concurrency 32
#   GPUS_PER_SHARD=2 bash scripts/launch_shards.sh python eval.py --tensor_parallel_size 2
#
# Settings (environment):
#   GPUS            comma-separated device ids to use (default: CUDA_VISIBLE_DEVICES,
#                   else every GPU `nvidia-smi -L` lists)
#   GPUS_PER_SHARD  GPUs per process (default 1; = --tensor_parallel_size)
#   NODE_SHARD      this node's index when several nodes share the run (default:
#                   SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN in a SLURM array, else 0)
#   NODE_COUNT      the number of such nodes, each running this launcher with the
#                   same GPU count (default: SLURM_ARRAY_TASK_COUNT, else 1)
#   LOG_DIR         per-shard logs (default shard_logs)
# Process k of this node is shard NODE_SHARD*P + k of NODE_COUNT*P (P processes
# per node), with CUDA_VISIBLE_DEVICES set to its GPUs. Do not pass
# --shard_index/--num_shards yourself. Exit status: the highest of the shards'
# (0 all done, 1 some task failed: rerun the same command, 2 usage error).
set -uo pipefail

die() { echo "error: $*" >&2; exit 2; }
(( $# > 0 )) || die "give the command to run, e.g. bash scripts/launch_shards.sh python mcts_collection.py --concurrency 32"

if [[ -n "${GPUS:-}" ]]; then
    devices="$GPUS"
elif [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    devices="$CUDA_VISIBLE_DEVICES"
elif command -v nvidia-smi >/dev/null && n="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" && (( n > 0 )); then
    devices="$(seq -s, 0 $((n - 1)))"
else
    die "no GPU found (nvidia-smi lists none): set GPUS, e.g. GPUS=0,1,2,3"
fi
IFS=, read -r -a gpu_list <<< "$devices"
per="${GPUS_PER_SHARD:-1}"
[[ "$per" =~ ^[1-9][0-9]*$ ]] || die "GPUS_PER_SHARD=$per is not a positive integer"
(( ${#gpu_list[@]} % per == 0 )) || die "${#gpu_list[@]} GPUs ($devices) do not split into groups of GPUS_PER_SHARD=$per"
procs=$(( ${#gpu_list[@]} / per ))

if [[ -n "${SLURM_ARRAY_TASK_ID:-}" && -z "${NODE_SHARD:-}" ]]; then
    [[ "${SLURM_ARRAY_TASK_STEP:-1}" == 1 ]] || die "SLURM array step ${SLURM_ARRAY_TASK_STEP}: sharding needs consecutive ids (--array=0-N)"
    NODE_SHARD=$(( SLURM_ARRAY_TASK_ID - ${SLURM_ARRAY_TASK_MIN:-0} ))
    NODE_COUNT="${NODE_COUNT:-${SLURM_ARRAY_TASK_COUNT:-1}}"
fi
node="${NODE_SHARD:-0}"
nodes="${NODE_COUNT:-1}"
[[ "$node" =~ ^[0-9]+$ && "$nodes" =~ ^[1-9][0-9]*$ ]] && (( node < nodes )) \
    || die "NODE_SHARD=$node must be in 0..NODE_COUNT-1 (NODE_COUNT=$nodes)"
total=$(( nodes * procs ))
log_dir="${LOG_DIR:-shard_logs}"
mkdir -p "$log_dir" || die "cannot create LOG_DIR=$log_dir"

pids=()
stop() { for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done; }
trap 'stop; wait; exit 130' INT TERM

for (( k = 0; k < procs; k++ )); do
    shard=$(( node * procs + k ))
    group="$(IFS=,; echo "${gpu_list[*]:$((k * per)):$per}")"
    log="$log_dir/shard-$shard-of-$total.log"
    CUDA_VISIBLE_DEVICES="$group" SHARD_INDEX="$shard" NUM_SHARDS="$total" "$@" > "$log" 2>&1 &
    pids+=($!)
    echo "shard $shard of $total: GPUs $group, pid $!, log $log"
done

worst=0
for (( k = 0; k < procs; k++ )); do
    wait "${pids[$k]}"
    rc=$?
    shard=$(( node * procs + k ))
    echo "shard $shard of $total exited $rc"
    (( rc > worst )) && worst=$rc
done
exit "$worst"
