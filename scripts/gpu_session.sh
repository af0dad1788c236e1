#!/usr/bin/env bash
# The GPU measurements the open issues owe, in stages that each fit one 10-minute call of a lent
# GPU machine (the whole list is about 30 minutes of device time). Each stage writes its logs and
# JSON into one archive, $OUT/gpu-session-N.tgz ($OUT: the device tool's folder; ./gpu-out
# elsewhere), and a failing step never stops the next one: it leaves its log and the stage goes on.
#
#   . .gpu/setup.sh && scripts/gpu_session.sh 0     # a first look in one call, by priority (below)
#   . .gpu/setup.sh && scripts/gpu_session.sh 1     # interop, then every small model on CUDA
#   . .gpu/setup.sh && scripts/gpu_session.sh 2     # every GEMM tiling (split-K too) against cuBLAS, and the refit
#   . .gpu/setup.sh && scripts/gpu_session.sh 3     # full-size models against torch.compile at fp32, tf32, bf16
#   . .gpu/setup.sh && scripts/gpu_session.sh 4     # --pipeline auto against the measured-fastest pipeline
#   . .gpu/setup.sh && scripts/gpu_session.sh 5     # persistent kernels at 2 blocks per SM against 1
#   . .gpu/setup.sh && scripts/gpu_session.sh 6     # where the time goes at bf16: per-kernel profiles, GEMMs vs cuBLAS
#   . .gpu/setup.sh && scripts/gpu_session.sh 7     # a short check: BERT-base and GPT-2 at bf16 beside torch.compile
#   . .gpu/setup.sh && scripts/gpu_session.sh 8     # the DEEP GEMM tilings (dynamic shared memory), and bound calls
#   . .gpu/setup.sh && scripts/gpu_session.sh 9     # tf32 on the cp.async pipeline, and tf32x3, against cuBLAS and torch
#   . .gpu/setup.sh && scripts/gpu_session.sh 10    # the short form of 8 and 9 in one call: the first thing to run next
#   . .gpu/setup.sh && scripts/gpu_session.sh 11    # the h100 spec's profile database (every kernel of the full-size models)
#   . .gpu/setup.sh && scripts/gpu_session.sh 12    # the fp32 vector SIMT tilings against the scalar ones and cuBLAS (~4 min)
#   . .gpu/setup.sh && scripts/gpu_session.sh 13    # dlcc's own kernels timed one by one at bf16 and fp32, and the cost model fitted on them
#   . .gpu/setup.sh && scripts/gpu_session.sh 14    # DEEP GEMMs as rTasks of persistent kernels (dynamic shared memory), off and on (~3 min)
#   . .gpu/setup.sh && scripts/gpu_session.sh 15    # GPT-2 with its LM head's weight stored transposed for cp.async, off and on (~3 min)
#   . .gpu/setup.sh && scripts/gpu_session.sh 16    # GPT-2 and ViT with their LayerNorms folded into the GEMMs, off and on (~4 min)
#   . .gpu/setup.sh && scripts/gpu_session.sh 17    # Hopper's wgmma GEMM tilings: on the hardware, against cuBLAS and mma.sync, then in models (~8 min)
#   . .gpu/setup.sh && scripts/gpu_session.sh 18    # torch.compile(backend="dlcc") on CUDA tensors beside inductor, and dynamic=True (~4 min)
#   . .gpu/setup.sh && scripts/gpu_session.sh 19    # --tune on the conv-heavy models: pipelines and Rammer's join decisions timed (~8 min)
#   . .gpu/setup.sh && scripts/gpu_session.sh 20    # Rammer's dependency counters against grid barriers, joined plans (~6 min)
#   . .gpu/setup.sh && scripts/gpu_session.sh 21    # the first look after 2026-11-27: wgmma, the backend, bf16 models, sync (~9 min)
#   . .gpu/setup.sh && scripts/gpu_session.sh 22    # what 21 left open: wgmma A/B in one process, the backend, interop, plan mode fitted on ResNet-50 and ViT (~9 min)
#
# What each number is for: issue 21 (stage 1: both import orders, device arrays, graphs, threads),
# issue 18 (stages 2 and 3: GEMM and model floors against cuBLAS and torch.compile), issue 20
# (stage 4: auto's picks and Kendall's tau; stage 2's --fit refreshes the GEMM time model that
# plan mode uses, configs/devices/h100.yaml gemm_cycle_us).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
# Everything a stage writes goes into one archive, $OUT/gpu-session-N.tgz: the device tool brings
# back only the first 8 files of $OUT (stage 10's tf32x3 record was lost that way).
FINAL=$(cd "$OUT" && pwd)
OUT="$FINAL/stage-${1:-x}"
mkdir -p "$OUT"
trap 'tar czf "$FINAL/gpu-session-${1:-x}.tgz" -C "$OUT" . && rm -rf "$OUT" && echo "[gpu-session] logs and records: $FINAL/gpu-session-${1:-x}.tgz" >&2' EXIT
PY="${PYTHON:-python3}"
MODELS=$(realpath -m "${MODELS_DIR:-.cache/models}")

spec_with() {  # spec_with FIELD TAG: the h100 spec with switch FIELD on, as $OUT/h100-TAG.yaml (to time it off and on)
  # run from /tmp: the checkout's dlcc/ folder would shadow the installed package
  (cd /tmp && "$PY" -c "import yaml; from dlcc.config import load_device; d = load_device('h100').model_dump(); \
d['$1'] = True; d['name'] += ' ($2)'; yaml.safe_dump(d, open('$OUT/h100-$2.yaml', 'w'))")
}

off_and_on() {  # off_and_on FIELD TAG SECONDS PRECISION: BERT-base and GPT-2 through full beside torch.compile
  # (reduce-overhead) with the h100 spec as shipped, then with switch FIELD on: steps PRECISION-h100 and PRECISION-h100-TAG
  spec_with "$1" "$2"
  local dev tag
  for dev in h100 "$OUT/h100-$2.yaml"; do
    tag=$(basename "$dev" .yaml)
    step "$4-$tag" "$3" "$PY" scripts/vs_torch.py --size full --models bert,gpt2 --precisions "$4" --pipelines full \
      --torch-modes reduce-overhead --device "$dev" --models-dir "$MODELS" --json-out "$OUT/$4-$tag.json"
  done
}

full_with() {  # full_with OPTION NAME: the `full` pipeline with lower's OPTION false, as $OUT/NAME.yaml
  (cd /tmp && "$PY" -c "import yaml; from dlcc.config import load_pipeline; p = load_pipeline('full').model_dump(); \
[q['options'].update($1=False) for q in p['passes'] if q['name'] == 'lower']; p['name'] = '$2'; \
yaml.safe_dump(p, open('$OUT/$2.yaml', 'w'))")
}

step() {  # step NAME SECONDS COMMAND...: run with a time limit, output to $OUT/NAME.log
  local name=$1 secs=$2
  shift 2
  echo "[gpu-session] $name: $*" >&2
  timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
  echo "[gpu-session] $name: exit $? (log $OUT/$name.log)" >&2
  tail -25 "$OUT/$name.log"
}

case "${1:-}" in
  0)
    # One 10-minute call (a lease is 15 minutes with its start), in the order of what matters:
    # the tensor-core and half-precision kernels on the hardware (small models, every precision,
    # against onnxruntime), BERT-base at bf16/fp32/tf32 beside torch.compile (issue 18's headline
    # floor), the interop scenarios (issue 21), GPT-2, then bf16 GEMMs against cuBLAS. The full-size
    # rows plan for the h100 spec (calibrated) whatever Hopper card runs them; the small rows plan
    # for the detected GPU, as a user gets. Each step leaves $OUT/NAME.log (and NAME.json).
    SMALL="${SMALL_MODELS_DIR:-$MODELS}"  # exported there, with that torch: vs_torch rebuilds each module from its seed
    step small 110 "$PY" scripts/vs_torch.py --size small --models bert,gpt2,vit,cnn --precisions tf32,fp16,bf16 \
      --pipelines astitch,full --torch-modes eager --repeat 10 --models-dir "$SMALL" --json-out "$OUT/small.json"
    step bert 200 "$PY" scripts/vs_torch.py --size full --models bert --precisions bf16,fp32,tf32 --pipelines full,astitch \
      --torch-modes reduce-overhead --device h100 --models-dir "$MODELS" --json-out "$OUT/bert.json"
    step interop 80 "$PY" scripts/interop_check.py
    step gpt2 110 "$PY" scripts/vs_torch.py --size full --models gpt2 --precisions bf16,fp32 --pipelines full \
      --torch-modes reduce-overhead --device h100 --models-dir "$MODELS" --json-out "$OUT/gpt2.json"
    step gemm-bf16 60 "$PY" scripts/gemm_tilings.py --precision bf16 --vs-torch --repeat 10 \
      --shapes 128x768x768,128x3072x768,128x768x3072,1024x1024x1024
    ;;
  1)
    step interop 150 "$PY" scripts/interop_check.py
    step interop-bert 90 "$PY" scripts/interop_check.py --model "$MODELS/bert-small.onnx" --scenario device-io \
      --scenario host-time
    step gpu-check-small 420 "$PY" scripts/gpu_check.py --pipelines astitch,full --json-out "$OUT/gpu-check-small.json"
    ;;
  2)
    for p in fp32 tf32 bf16; do
      step "gemm-$p" 170 "$PY" scripts/gemm_tilings.py --precision "$p" --vs-torch --repeat 10 --json "$OUT/gemm-$p.json"
    done
    step gemm-fit 30 "$PY" scripts/gemm_tilings.py --fit "$OUT"/gemm-*.json
    ;;
  3)
    step vs-torch 560 "$PY" scripts/vs_torch.py --size full --models bert,gpt2,vit,cnn --precisions fp32,tf32,bf16 \
      --models-dir "$MODELS" --json-out "$OUT/vs-torch.json"
    ;;
  4)
    step auto-accuracy 560 "$PY" scripts/auto_accuracy.py --target cuda --device h100 --size full \
      --models bert,cnn,gpt2,vit --models-dir "$MODELS"
    ;;
  5)
    step bps2 560 "$PY" scripts/gpu_check.py --size full --models mobilenet,yolo,cnn,bert --models-dir "$MODELS" \
      --pipelines astitch,full,scripts/data/pipelines/full-bps2.yaml --json-out "$OUT/bps2.json"
    ;;
  6)
    # Per-kernel device times of BERT-base and GPT-2 through astitch at bf16 (dlcc profile; the
    # database comes back as JSON to study offline), the interop scenarios, and the bf16 and tf32
    # GEMM tilings (split-K too) against cuBLAS on the six issue shapes.
    export COLUMNS=200
    step interop 70 "$PY" scripts/interop_check.py
    step gemm-bf16 130 "$PY" scripts/gemm_tilings.py --precision bf16 --vs-torch --repeat 10 --json "$OUT/gemm-bf16.json"
    for m in bert gpt2; do
      "$PY" -c "import sys; sys.path.insert(0, 'scripts'); import models; models.export('$m', __import__('pathlib').Path('$MODELS'), 'full')" >/dev/null 2>&1
      # python -m dlcc from outside the checkout, whose dlcc/ folder would shadow the installed package
      (cd /tmp && step "prof-$m" 70 "$PY" -m dlcc profile "$MODELS/$m-full.onnx" --db "$OUT/prof-$m.json" \
        --target cuda --device h100 --pipeline astitch --precision bf16 --repeat 5)
    done
    step gemm-tf32 120 "$PY" scripts/gemm_tilings.py --precision tf32 --vs-torch --repeat 10
    ;;
  7)
    # A short check after a change to tilings or joins (one ~4-minute call): BERT-base and GPT-2 at
    # bf16 through astitch and full beside torch.compile, a kernel's cost in a CUDA graph, and
    # BERT's three GEMM shapes at bf16 against cuBLAS.
    step bert 75 "$PY" scripts/vs_torch.py --size full --models bert --precisions bf16 --pipelines astitch,full \
      --torch-modes reduce-overhead --device h100 --models-dir "$MODELS" --json-out "$OUT/bert.json"
    step gpt2 70 "$PY" scripts/vs_torch.py --size full --models gpt2 --precisions bf16 --pipelines astitch,full \
      --torch-modes reduce-overhead --device h100 --models-dir "$MODELS" --json-out "$OUT/gpt2.json"
    step graph-gap 20 "$PY" scripts/graph_gap.py
    step gemm-bf16 45 "$PY" scripts/gemm_tilings.py --precision bf16 --vs-torch --repeat 10 \
      --shapes 128x768x768,128x3072x768,128x768x3072
    ;;
  8)
    # The DEEP GEMM tilings (4-8 stages in dynamic shared memory, kernels/gemm_mma.py), untimed
    # before (one ~5-minute call): every bf16 tiling, DEEP ones included, on the six issue shapes
    # against cuBLAS (the record --fit reads); then BERT-base and GPT-2 at bf16 through full with
    # the h100 spec as shipped and with gemm_deep_pipelines on, beside torch.compile; the bound
    # call's host time (issue 21); a grid barrier's cost (issue 20). Turn gemm_deep_pipelines on in configs/devices/h100.yaml where
    # the second beats the first, and refit mma_cycle_us on the new record.
    step gemm-deep 150 "$PY" scripts/gemm_tilings.py --precision bf16 --vs-torch --repeat 10 --json "$OUT/gemm-deep.json"
    off_and_on gemm_deep_pipelines deep 60 bf16
    step interop-host 40 "$PY" scripts/interop_check.py --scenario host-time
    step graph-gap 25 "$PY" scripts/graph_gap.py  # a kernel in a graph, and a grid barrier (grid_barrier_us)
    ;;
  9)
    # tf32 on the cp.async pipeline and tf32x3 (float32 accuracy from three TF32 mmas), untimed
    # before (one ~9-minute call): the small models at both against onnxruntime on the hardware;
    # every tf32 and tf32x3 tiling on the six issue shapes against cuBLAS (tf32 against its TF32,
    # tf32x3 against its float32: the records --fit reads); BERT-base at fp32, tf32x3 and tf32
    # through full and astitch beside torch.compile; GPT-2 at fp32 and tf32x3 through full.
    SMALL="${SMALL_MODELS_DIR:-$MODELS}"  # exported there, with that torch: vs_torch rebuilds each module from its seed
    step small-x3 90 "$PY" scripts/vs_torch.py --size small --models bert,gpt2,vit,cnn --precisions tf32x3,tf32 \
      --pipelines astitch,full --torch-modes eager --repeat 10 --models-dir "$SMALL" --json-out "$OUT/small-x3.json"
    for p in tf32 tf32x3; do
      step "gemm-$p" 120 "$PY" scripts/gemm_tilings.py --precision "$p" --vs-torch --repeat 10 --json "$OUT/gemm-$p.json"
    done
    step bert-x3 170 "$PY" scripts/vs_torch.py --size full --models bert --precisions fp32,tf32x3,tf32 \
      --pipelines full,astitch --torch-modes reduce-overhead --device h100 --models-dir "$MODELS" \
      --json-out "$OUT/bert-x3.json"
    step gpt2-x3 80 "$PY" scripts/vs_torch.py --size full --models gpt2 --precisions fp32,tf32x3 --pipelines full \
      --torch-modes reduce-overhead --device h100 --models-dir "$MODELS" --json-out "$OUT/gpt2-x3.json"
    ;;
  10)
    # Everything built since the last GPU session, in one ~9-minute call, by priority: the new
    # kernels' results on the hardware (the small models at tf32x3 and tf32 against onnxruntime,
    # checked inside gemm_tilings too); the bf16 DEEP tilings, the tf32 cp.async tilings and the
    # tf32x3 ones against cuBLAS on BERT's shapes and 1024^3; BERT-base with the DEEP tilings on at
    # bf16, and at fp32 and tf32x3 through full, beside torch.compile; the bound call's host time.
    # Stages 8 and 9 are the longer forms.
    SMALL="${SMALL_MODELS_DIR:-$MODELS}"  # exported there, with that torch: vs_torch rebuilds each module from its seed
    SHAPES=128x768x768,128x3072x768,128x768x3072,1024x1024x1024
    step small-x3 90 "$PY" scripts/vs_torch.py --size small --models bert,gpt2,vit,cnn --precisions tf32x3,tf32 \
      --pipelines astitch,full --torch-modes eager --repeat 10 --models-dir "$SMALL" --json-out "$OUT/small-x3.json"
    for p in bf16 tf32 tf32x3; do
      step "gemm-$p" 80 "$PY" scripts/gemm_tilings.py --precision "$p" --vs-torch --repeat 10 --shapes "$SHAPES" \
        --json "$OUT/gemm-$p.json"
    done
    spec_with gemm_deep_pipelines deep
    step bert-deep 60 "$PY" scripts/vs_torch.py --size full --models bert --precisions bf16 --pipelines full,astitch \
      --torch-modes reduce-overhead --device "$OUT/h100-deep.yaml" --models-dir "$MODELS" --json-out "$OUT/bert-deep.json"
    step bert-x3 130 "$PY" scripts/vs_torch.py --size full --models bert --precisions fp32,tf32x3 --pipelines full \
      --torch-modes reduce-overhead --device h100 --models-dir "$MODELS" --json-out "$OUT/bert-x3.json"
    step interop-host 40 "$PY" scripts/interop_check.py --scenario host-time
    ;;
  11)
    # The profile database the h100 spec comes with (issue 20: `auto` and `dlcc estimate` use
    # measured times where they have them): every kernel launch of the full-size test models
    # through astitch and full at fp32 and bf16, planned for the h100 spec, timed by dlcc profile
    # into one database. Check it in as configs/devices/h100.profile.json with `profile_db:
    # h100.profile.json` in configs/devices/h100.yaml. Kernels are keyed by a hash of their source,
    # so entries of kernels a later change rewrites stop matching, and the cost model takes over.
    for m in bert gpt2 vit cnn; do
      "$PY" -c "import sys; sys.path.insert(0, 'scripts'); import models; models.export('$m', __import__('pathlib').Path('$MODELS'), 'full')" >/dev/null 2>&1
      for p in astitch full; do
        for pr in bf16 fp32; do
          # python -m dlcc from outside the checkout, whose dlcc/ folder would shadow the installed package
          (cd /tmp && step "prof-$m-$p-$pr" 40 "$PY" -m dlcc profile "$MODELS/$m-full.onnx" --db "$OUT/h100.profile.json" \
            --target cuda --device h100 --pipeline "$p" --precision "$pr" --repeat 5 -q)
        done
      done
    done
    ;;
  12)
    # The fp32 SIMT GEMM's vector template (kernels/gemm.py VECTOR_TILINGS: two shared stages, float4
    # shared reads): each vector tiling beside its scalar twin and cuBLAS fp32 on BERT's shapes and
    # 1024^3 (GPT-2's LM head took over 60 s of sweeping alone, and ran the step out of time), then
    # BERT-base and GPT-2 at fp32 through full with them on, beside torch.compile. First run on an
    # H200 on 2026-11-27, after which simt_vector_tilings went on in configs/devices/h100.yaml;
    # rerun it after a change to the vector template.
    spec_with simt_vector_tilings vec
    step gemm-fp32-vec 100 "$PY" scripts/gemm_tilings.py --precision fp32 --tilings vector --vs-torch --repeat 10 \
      --device "$OUT/h100-vec.yaml" --shapes 128x768x768,128x3072x768,128x768x3072,1024x1024x1024 \
      --json "$OUT/gemm-fp32-vec.json"
    step models-fp32-vec 120 "$PY" scripts/vs_torch.py --size full --models bert,gpt2 --precisions fp32 --pipelines full \
      --torch-modes reduce-overhead --device "$OUT/h100-vec.yaml" --models-dir "$MODELS" --json-out "$OUT/models-fp32-vec.json"
    ;;
  13)
    # Where plan mode's error comes from (issue 20: predicted within 1.5x of measured). On an H200
    # on 2026-11-27 it predicted BERT-base bf16 `full` at 439 µs against 707-740 measured, and
    # GPT-2 at 444 against 871, while fp32 was within 1.3x and the GEMMs alone are fitted. So
    # every launch of BERT-base and GPT-2 through astitch and full is timed alone at bf16 and
    # fp32, beside the whole inference and both predictions, and the cost-model constants are
    # fitted on dlcc's own kernels, class by class (memory-bound, GEMM, fused GEMM, persistent).
    # The samples come back for offline study. About 5 minutes.
    for pr in bf16 fp32; do
      step "plan-acc-$pr" 200 "$PY" scripts/plan_accuracy.py --target cuda --device h100 --size full --models bert,gpt2 \
        --precision "$pr" --pipelines astitch,full --fit --repeat 10 --cache "$MODELS" --samples "$OUT/plan-acc-$pr-samples.json"
    done
    ;;
  14)
    # Persistent kernels with dynamic shared memory (DeviceSpec.persistent_dynamic_smem), so that
    # GEMMs on the DEEP tilings can be their rTasks: BERT-base and GPT-2 at bf16 through full with
    # the h100 spec as shipped and with the switch on, beside torch.compile, every output checked
    # against onnxruntime. Turn it on in configs/devices/h100.yaml where the second beats the first.
    off_and_on persistent_dynamic_smem dyn 80 bf16
    ;;
  15)
    # GEMM weights stored transposed for cp.async (lower's transpose_weights; docs/gemm.md): GPT-2,
    # whose LM head is [768, 50257], at bf16 and tf32 through full, with the option on (as shipped)
    # and off, beside torch.compile, every output checked against onnxruntime. About 3 minutes.
    # The "on" rows also carry the DEEP tilings Rammer gives back and the attention output stored
    # as [tokens, heads x d] (docs/gemm.md, docs/astitch.md): compare them with the 871 µs of
    # scripts/data/h200-2026-11-27/vs_torch_bf16_deep.json (stage 7 gives BERT-base's).
    full_with transpose_weights full-untransposed
    for pr in bf16 tf32; do
      step "gpt2-$pr" 120 "$PY" scripts/vs_torch.py --size full --models gpt2 --precisions "$pr" \
        --pipelines "full,$OUT/full-untransposed.yaml" --torch-modes reduce-overhead --device h100 \
        --models-dir "$MODELS" --json-out "$OUT/gpt2-$pr.json"
    done
    ;;
  16)
    # LayerNorms computed inside the GEMMs that read them (lower's fold_layernorm; docs/gemm.md):
    # GPT-2 at bf16 and fp32, and ViT-B/16 at bf16, through full with the fold on (as shipped) and
    # off, beside torch.compile, every output checked against onnxruntime. Plan mode says GPT-2
    # bf16 goes from 86 launches to 61 and from 432 to 388 µs; the statistics' shared-memory reads
    # in the k loop are not priced, so this is what settles it. About 4 minutes.
    full_with fold_layernorm full-unfolded
    for run in "gpt2 bf16" "gpt2 fp32" "vit bf16"; do
      read -r m pr <<<"$run"  # (not `set --`: the archive's trap reads $1)
      step "$m-$pr" 120 "$PY" scripts/vs_torch.py --size full --models "$m" --precisions "$pr" \
        --pipelines "full,$OUT/full-unfolded.yaml" --torch-modes reduce-overhead --device h100 \
        --models-dir "$MODELS" --json-out "$OUT/$m-$pr.json"
    done
    ;;
  17)
    # Hopper's warpgroup MMA (kernels/gemm_wgmma.py), never run on a GPU before; in order of
    # importance (one ~8-minute call):
    # 1. correctness on the hardware: every wgmma tiling at bf16, split and unsplit, on a small
    #    odd shape, each checked against numpy inside gemm_tilings (a MISMATCH line ends the step);
    # 2. the small models through astitch and full with gemm_wgmma on (every GEMM then a wgmma
    #    one where the model prefers it), against onnxruntime;
    # 3. every bf16 tiling (mma.sync, DEEP and wgmma: on an sm_90 GPU the family holds them all)
    #    on BERT's shapes and 1024^3 against cuBLAS: the record `gemm_tilings.py --fit` reads;
    # 4. BERT-base and GPT-2 at bf16 through full with the h100 spec as shipped and with
    #    gemm_wgmma on, beside torch.compile.
    # Turn gemm_wgmma on in configs/devices/h100.yaml where 4's second row beats its first, and
    # refit the wgmma constants (gemm_wgmma.py WGMMA_RATE) on 3's record.
    SMALL="${SMALL_MODELS_DIR:-$MODELS}"
    step wgmma-check 60 "$PY" scripts/gemm_tilings.py --precision bf16 --tilings wgmma --repeat 2 --shapes 70x136x520
    spec_with gemm_wgmma wgmma
    step small-wgmma 90 "$PY" scripts/vs_torch.py --size small --models bert,gpt2,vit,cnn --precisions bf16 \
      --pipelines astitch,full --torch-modes eager --repeat 10 --device "$OUT/h100-wgmma.yaml" --models-dir "$SMALL" \
      --json-out "$OUT/small-wgmma.json"
    step gemm-bf16 150 "$PY" scripts/gemm_tilings.py --precision bf16 --vs-torch --repeat 10 \
      --shapes 128x768x768,128x3072x768,128x768x3072,1024x1024x1024 --json "$OUT/gemm-bf16.json"
    off_and_on gemm_wgmma wgmma 70 bf16
    ;;
  18)
    # torch.compile(backend="dlcc") (dlcc/torch_backend.py), never run on a GPU before: the small
    # models first (CUDA tensors in by DLPack, out as torch CUDA tensors, judged against
    # onnxruntime), then BERT-base and GPT-2 at bf16 and fp32 beside inductor's reduce-overhead,
    # in one process each.
    SMALL="${SMALL_MODELS_DIR:-$MODELS}"
    step small-backend 90 "$PY" scripts/vs_torch.py --size small --models bert,gpt2,vit,cnn --precisions fp32,bf16 \
      --pipelines full --torch-modes eager,dlcc-backend --repeat 10 --models-dir "$SMALL" \
      --json-out "$OUT/small-backend.json"
    step full-backend 150 "$PY" scripts/vs_torch.py --size full --models bert,gpt2 --precisions bf16,fp32 \
      --pipelines full --torch-modes reduce-overhead,dlcc-backend --models-dir "$MODELS" \
      --json-out "$OUT/full-backend.json"
    ;;
  19)
    # dlcc compile --tune on the conv-heavy models, where `full` lost to `astitch` on an H100
    # (issue 20): the pipelines, then Rammer's join decisions where the estimate is in doubt (each
    # run flipped, all joined, all apart, 2 blocks per SM, sync: counters), each timed on the GPU. Each --json line
    # holds every time measured; the stage asks whether a join variant closes full's gap.
    for m in yolo mobilenet ocr cnn; do
      "$PY" -c "import sys; sys.path.insert(0, 'scripts'); import models; models.export('$m', __import__('pathlib').Path('$MODELS'), 'full')" >/dev/null 2>&1
      (cd /tmp && step "tune-$m" 130 "$PY" -m dlcc compile "$MODELS/$m-full.onnx" -o "$OUT/$m.dlcc" -t cuda \
        --device h100 --tune --tune-top 3 --tune-repeat 20 --cache "$OUT/cache" --json)
    done
    ;;
  20)
    # rammer `sync: counters` (per-entry dependency counters) against one grid barrier per wave,
    # never timed on a GPU: `full` with every run joined in each mode, beside `full`'s own plan, in
    # interleaved rounds; below 1 in the last column, counters pay on that model.
    for m in lstm-tc bert gpt2 yolo; do
      "$PY" -c "import sys; sys.path.insert(0, 'scripts'); import models; models.export('$m', __import__('pathlib').Path('$MODELS'), 'full')" >/dev/null 2>&1
    done
    step sync-full 300 "$PY" scripts/bench_sync.py --models lstm-tc,bert,gpt2,yolo --size full --device h100 \
      --target cuda --repeat 30 --out-dir "$MODELS" --json-out "$OUT/sync-full.json"
    ;;
  21)
    # The first look at everything built without a GPU since 2026-11-27, in one ~9-minute call
    # (a lease is 15 minutes with its start), in order of what matters:
    # 1. the wgmma tilings' correctness on the hardware (stage 17's first step);
    # 2. the small models at fp32 and bf16 through astitch and full, and torch.compile(backend=
    #    "dlcc") on CUDA tensors (stage 18's first step), all against onnxruntime;
    # 3. BERT-base and GPT-2 at bf16 through full as shipped (transposed weights, folded
    #    LayerNorms, DEEP rTasks) beside inductor's reduce-overhead and the dlcc backend;
    # 4. the same with gemm_wgmma on (stage 17's last step, its first row is 3's);
    # 5. ViT-B/16 and ResNet-50 at bf16 through full and astitch beside reduce-overhead;
    # 6. grid barriers against dependency counters on BERT-base and YOLO (stage 20, shortened).
    SMALL="${SMALL_MODELS_DIR:-$MODELS}"
    step wgmma-check 40 "$PY" scripts/gemm_tilings.py --precision bf16 --tilings wgmma --repeat 2 --shapes 70x136x520
    step small 110 "$PY" scripts/vs_torch.py --size small --models bert,gpt2,vit,cnn --precisions fp32,bf16 \
      --pipelines astitch,full --torch-modes eager,dlcc-backend --repeat 10 --models-dir "$SMALL" \
      --json-out "$OUT/small.json"
    step full-bf16 150 "$PY" scripts/vs_torch.py --size full --models bert,gpt2 --precisions bf16 --pipelines full \
      --torch-modes reduce-overhead,dlcc-backend --device h100 --models-dir "$MODELS" --json-out "$OUT/full-bf16.json"
    spec_with gemm_wgmma wgmma
    step full-bf16-wgmma 75 "$PY" scripts/vs_torch.py --size full --models bert,gpt2 --precisions bf16 --pipelines full \
      --torch-modes reduce-overhead --device "$OUT/h100-wgmma.yaml" --models-dir "$MODELS" \
      --json-out "$OUT/full-bf16-wgmma.json"
    step vit-cnn-bf16 100 "$PY" scripts/vs_torch.py --size full --models vit,cnn --precisions bf16 --pipelines full,astitch \
      --torch-modes reduce-overhead --device h100 --models-dir "$MODELS" --json-out "$OUT/vit-cnn-bf16.json"
    step sync 60 "$PY" scripts/bench_sync.py --models bert,yolo --size full --device h100 --target cuda --repeat 20 \
      --out-dir "$MODELS" --json-out "$OUT/sync.json"
    ;;
  22)
    # What stage 21 (an H200, 2026-12-04) left open, in one ~9-minute call, in order:
    # 1. gemm_wgmma off and on in one process, interleaved (scripts/ab_spec.py): torch's own time
    #    moved 15-30% between stage 21's processes, so its rows could not say whether to turn it on;
    # 2. the torch backend after its three fixes (bf16 graphs that cast inside, GPT-2's export on
    #    the CPU, no weight casts per call): the small models, then BERT-base and GPT-2 at bf16
    #    beside inductor's reduce-overhead;
    # 3. where a backend call's host time goes (BERT small at fp32: 637 µs against 50 for its plan);
    # 4. the interop scenarios, whose host-time one has not run since bound calls (issue 21's
    #    floor: 30 µs a call);
    # 5. plan mode against ResNet-50 and ViT-B/16 at bf16, every launch timed alone, and the cost
    #    model fitted on them (stage 13's method): predicted 223 and 506 µs through astitch, they ran
    #    1087 and 1397, and ViT's order of astitch and full came out wrong.
    # (Stage 20, barriers against counters, is still to run: it did not fit in stage 21's call.)
    SMALL="${SMALL_MODELS_DIR:-$MODELS}"
    step ab-wgmma 120 "$PY" scripts/ab_spec.py --models cnn,bert --size full --precision bf16 \
      --switch gemm_wgmma --device h100 --repeat 30 --models-dir "$MODELS" --json-out "$OUT/ab-wgmma.json"
    step small-backend 80 "$PY" scripts/vs_torch.py --size small --models bert,gpt2,vit,cnn --precisions fp32,bf16 \
      --pipelines full --torch-modes eager,dlcc-backend --repeat 10 --models-dir "$SMALL" \
      --json-out "$OUT/small-backend.json"
    step full-backend 100 "$PY" scripts/vs_torch.py --size full --models bert,gpt2 --precisions bf16 \
      --pipelines full --torch-modes reduce-overhead,dlcc-backend --device h100 --models-dir "$MODELS" \
      --json-out "$OUT/full-backend.json"
    step backend-profile 40 "$PY" scripts/backend_profile.py --model bert --size small --precision fp32 \
      --models-dir "$SMALL"
    step interop 50 "$PY" scripts/interop_check.py
    step plan-acc-bf16 150 "$PY" scripts/plan_accuracy.py --target cuda --device h100 --size full --models cnn,vit \
      --precision bf16 --pipelines astitch,full --fit --repeat 10 --cache "$MODELS" --samples "$OUT/plan-acc-samples.json"
    ;;
  *)
    echo "usage: scripts/gpu_session.sh 0|1|...|22   (the stages are described at the top of this file)" >&2
    exit 2
    ;;
esac
