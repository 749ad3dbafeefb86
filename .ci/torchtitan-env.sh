#!/usr/bin/env bash
# .venv-torchtitan: torchtitan 0.3.0 and what importing its llama3 configs needs, for
# tests/plan/test_torchtitan.py, which parses `lmperf plan`'s torchtitan forms with torchtitan's
# own ConfigManager (tests/plan/torchtitan_parse.py). An environment of its own: torchtitan's
# imports (datasets, tensorboard, triton) are not the test suite's.
#
# torchtitan goes in --no-deps: of its requirements, parsing imports datasets, tensorboard,
# torchdata, tokenizers and tyro (+ spmd_types, pinned by it); it does not import wandb, einops,
# pillow, safetensors or torch_checkpointing, which are left out. Also needed: triton (imported
# by torchtitan/distributed/minimal_async_ep at import time), torchao (llama3_405b and the float8
# configs build torchao's Float8Linear config). torch, numpy, triton at the versions of
# constraints.txt (torch 2.13.0's CPU wheel lies on this machine's disk).
# Measured on the 2-core machine from scratch: 60 s, 405 MB downloaded (triton 280 MB of it;
# torch is the local wheel), 2.4 GB on disk; a second run is a no-op (the stamp is this
# script's hash).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-torchtitan
stamp="$venv/.installed-$(sha1sum .ci/torchtitan-env.sh | cut -c1-12)"
[ -f "$stamp" ] && exit 0
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints.txt \
    torch triton numpy tyro==1.0.17 'datasets==4.7.0' tensorboard==2.21.0 torchdata==0.11.0 \
    tokenizers==0.23.3
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    torchtitan==0.3.0 spmd_types==0.2.3 torchao==0.18.0
"$venv/bin/python" -c "import torchtitan.models.llama3.config_registry" 2>/dev/null
touch "$stamp"
echo "ci: $venv ready (torchtitan 0.3.0)"
