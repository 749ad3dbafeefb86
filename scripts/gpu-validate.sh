#!/usr/bin/env bash
# The first run of lmperf on a lent GPU: every step under its own time limit, 9 minutes in all on
# an H100, in order of value; at most 8 files written into $OUT. docs/gpu-validation.md says how
# to run it and what each output should show.
#
#   OUT=dir bash scripts/gpu-validate.sh            # every step
#   OUT=dir bash scripts/gpu-validate.sh bench      # rerun one step (or several) by name
#
# Written for the lent machine: Python 3.12 (`python3`, or $PYTHON) with its own CUDA torch, no
# package index. lmperf runs from this checkout (PYTHONPATH=src), nothing is installed. ijson is
# optional (traces are then read by the json module), torchao too (bench's float8 runs are then
# skipped, saying why); to carry their wheels, run here
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_28_x86_64 -d .whl ijson==3.6.0 torchao==0.18.0
# and name .whl in the device tool's carry: the wheels found in .whl/ are installed into /tmp/site.
#
# Outputs: gpu-validate.log (everything printed, the environment included), doctor.jsonl,
# bench.jsonl (the bench and attention steps' records), predict.jsonl, profile.jsonl,
# trace.json.gz, memory.jsonl, dist.jsonl.
# Exits 2 without a CUDA device, else with the number of steps that failed or timed out.
set -uo pipefail
cd "$(dirname "$0")/.."

STEPS=(env doctor attention bench predict profile memory dist)
# Seconds per step; the sum (540) is the 9 minutes of the budget. The H200 run of 2026-11-27
# took env 4, doctor 102, bench 51, predict 12, profile 15, memory 34, dist 49 s; bench has
# since gained issue 41's op checkpointing and float8 runs (5 more jobs, ~35 s estimated).
declare -A LIMIT=([env]=10 [doctor]=125 [attention]=125 [bench]=125 [predict]=25 [profile]=30
                  [memory]=40 [dist]=60)
# A step whose records go into another step's file: the device tool brings back 8 files.
declare -A INTO=([attention]=bench)

export OUT=${OUT:-results/gpu-validate}
export PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG="$OUT/gpu-validate.log"

for step in "$@"; do
    [[ -n "${LIMIT[$step]:-}" ]] || { echo "gpu-validate: unknown step '$step' (steps: ${STEPS[*]})" >&2; exit 2; }
done
(($#)) && STEPS=("$@")

# No CUDA device: say so at once (this also runs on CI's CPU machine, by test).
if ! why=$(timeout 50 "$PY" -c 'import torch; print(torch.cuda.device_count())' 2>&1); then
    echo "gpu-validate: no CUDA device: $PY cannot import torch (${why##*$'\n'})" | tee -a "$LOG" >&2
    exit 2
elif [[ "${why##*$'\n'}" == 0 ]]; then
    echo "gpu-validate: no CUDA device: torch sees none" | tee -a "$LOG" >&2
    exit 2
fi
if compgen -G ".whl/*.whl" >/dev/null; then  # carried wheels (ijson): see the header
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

# The GPU's name in the peak table, for --predict (H100-SXM, H200, ...; H100 if not found).
GPU=$("$PY" -c 'import torch; from lmperf.runtime.peaks import spec_for_device_name as f
s = f(torch.cuda.get_device_name()); print(s.name if s else "H100")' 2>/dev/null || echo H100)
WORK=$(mktemp -d /tmp/gpu-validate.XXXXXX)
export GPU WORK

lm() { "$PY" -m lmperf "$@"; }

step_env() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.max.mem,power.limit --format=csv
    nvidia-smi
    echo "ncu: $(command -v ncu || echo none); nsys: $(command -v nsys || echo none)"
    "$PY" - <<'PYEOF'
import importlib.metadata as md, sys
import torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
p = torch.cuda.get_device_properties(0)
print("device", p.name, f"sm {p.major}.{p.minor}", f"{p.total_memory / 2**30:.1f} GiB",
      f"{p.multi_processor_count} SMs", "count", torch.cuda.device_count())
for name in ("triton", "numpy", "pandas", "rich", "tabulate", "jinja2", "matplotlib", "ijson",
             "nvidia-ml-py", "torchao", "setuptools"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "MISSING")
import lmperf
print("lmperf", lmperf.__version__, lmperf.__file__)
PYEOF
    lm --version
}

step_doctor() {
    lm doctor --device cuda --timeout 90 --out "$WORK/doctor.jsonl"
}

step_attention() {  # flash-triton against naive and SDPA (issue 37); its launch search is untimed
    lm attention --device cuda --suite flash --attention naive sdpa flash-triton \
        --context 1024 4096 16384 --d 64 128 --dtype bf16 --steps 50 --timeout 60 \
        --out "$WORK/bench.jsonl"
}

step_bench() {  # then issue 41's levers, each beside its own baseline: op checkpointing, and
                # float8 where the GPU has FP8 tensor cores (sm_89 and newer) and torchao is here
    lm bench --device cuda --size small --context 512 --batch 4 --precision fp32 bf16-mixed \
        --attention naive sdpa flash-triton --warmup 3 --steps 10 --timeout 60 --out "$WORK/bench.jsonl"
    lm bench --device cuda --size small --context 512 --batch 4 --precision bf16-mixed \
        --attention sdpa --checkpoint none op --warmup 3 --steps 10 --timeout 60 \
        --out "$WORK/bench.jsonl"
    why=$("$PY" -c 'import torch; from lmperf.runtime.device import float8_unsupported_reason as f
print(f(torch.device("cuda"), "rowwise") or "")' 2>&1 | tail -n 1)
    if [[ -z "$why" ]]; then
        lm bench --device cuda --size small --context 512 --batch 4 --precision bf16-mixed \
            --attention sdpa --float8 none tensorwise rowwise --warmup 3 --steps 10 --timeout 60 \
            --out "$WORK/bench.jsonl"
    else
        echo "bench --float8: skipped: $why"
    fi
}

step_predict() {  # the same specs, predicted for this GPU: counted on the CPU, the host's time
                  # per op probed on this GPU with each spec's own ops (estimate/host.py)
    lm bench --predict "$GPU" --device cuda --size small --context 512 --batch 4 \
        --precision fp32 bf16-mixed --attention naive sdpa flash-triton --out "$WORK/predict.jsonl"
}

step_profile() {
    lm profile --device cuda --size small --context 512 --batch 4 --precision bf16-mixed \
        --attention sdpa --warmup 2 --steps 3 --timeout 25 --trace "$WORK/trace.json" \
        --out "$WORK/profile.jsonl" && gzip -c "$WORK/trace.json" > "$OUT/trace.json.gz"
}

step_memory() {  # estimated first (CPU only, seconds), then measured
    lm memory --estimate --device cuda --size small --context 512 2048 --batch 4 \
        --precision fp32 bf16-mixed --out "$WORK/memory.jsonl"
    lm memory --device cuda --size small --context 512 2048 --batch 4 --precision fp32 bf16-mixed \
        --timeout 35 --out "$WORK/memory.jsonl"
}

step_dist() {  # dist train on 1 NCCL rank: bf16 autocast with every block checkpointed, then fp32
    lm dist train --device cuda --world-size 1 --strategy single --size small --context 4096 \
        --batch 2 --precision bf16-mixed --checkpoint 1 --warmup 1 --steps 3 --profile-steps 1 \
        --no-plots --timeout 40 --out "$WORK/dist.jsonl"
    lm dist train --device cuda --world-size 1 --strategy single --size small --warmup 1 \
        --steps 3 --profile-steps 1 --no-plots --timeout 40 --out "$WORK/dist.jsonl"
}

rows_failed() {  # FILE SKIP: "N of M rows error/oom/fail" over the records after line SKIP, or ""
    [[ -f "$1" ]] || return 0
    tail -n +"$(($2 + 1))" "$1" | "$PY" -c 'import json, sys
def row(line):
    try:
        return json.loads(line)
    except ValueError:  # a line cut short by a kill counts as failed
        return {"status": "error"}
rows = [row(line) for line in sys.stdin if line.strip()]
bad = [r for r in rows if r.get("status") in ("error", "oom")
       or (r.get("metrics") or {}).get("status") == "fail"]
print(f"{len(bad)} of {len(rows)} rows error, oom or fail" if bad else "")'
}

declare -A before=()
export -f lm "${STEPS[@]/#/step_}"
echo "gpu-validate: $(date -u '+%F %T') UTC, $GPU, steps: ${STEPS[*]}, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" | tee -a "$LOG"
failed=0
for step in "${STEPS[@]}"; do
    limit=${LIMIT[$step]}
    echo "== $step (limit ${limit} s) $(date -u +%H:%M:%S)" | tee -a "$LOG"
    start=$SECONDS
    timeout -k 10 "$limit" bash -c "step_$step" 2>&1 | tee -a "$LOG"
    code=${PIPESTATUS[0]}
    file=${INTO[$step]:-$step}.jsonl
    [[ -f "$WORK/$file" ]] && cp "$WORK/$file" "$OUT/$file"
    # Failures are rows (the command exits 0): a step with an error, oom or failed-check row
    # since it started fails too (the first run's bench said "ok" over 6 error rows).
    bad=$(rows_failed "$WORK/$file" "${before[$file]:-0}")
    case $code in
        0) verdict=ok ;;
        124|137) verdict="TIMED OUT" ;;
        *) verdict="exit $code" ;;
    esac
    [[ "$code" == 0 && -n "$bad" ]] && { verdict="FAILED ROWS: $bad"; code=1; }
    before[$file]=$(wc -l < "$WORK/$file" 2>/dev/null || echo 0)
    ((code)) && failed=$((failed + 1))
    echo "== $step: $verdict after $((SECONDS - start)) s" | tee -a "$LOG"
done
rm -rf "$WORK"
exit "$failed"
