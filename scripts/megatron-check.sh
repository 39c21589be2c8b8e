#!/usr/bin/env bash
# megatron-check.sh: run Megatron-LM's own argument validation on stepcast's exports.
#
# Optional developer check, not used by the build or the tests (stepcast needs Debian packages
# only). `stepcast plan --out DIR` writes DIR/NN-NAME.megatron.txt, Megatron-LM's launch arguments
# with rules cited at Megatron-LM commit d98e8a64ddf3. This script feeds each file to that
# commit's pretrain_gpt.py startup, on the CPU, without a GPU:
#   parse_args, validate_args, set_global_variables (microbatches, tokenizer),
#   gpt_config_from_args (TransformerConfig + ModelParallelConfig __post_init__, GPTModelConfig),
#   pretrain_cfg_container_from_args (DDP, optimizer, checkpoint ... configs)
#   and gpt_builder (the whole GPTModel, on the meta device, its parameters against the plan's),
# and says per file: accepted, or rejected with Megatron's exception and its file:line.
# The GPU queries and Transformer Engine lookups that validation makes are stubbed; see the
# header of scripts/megatron_check.py for the list.
#
# With --deepspeed it checks the DeepSpeed exports (NN-NAME.deepspeed.json) instead, with
# DeepSpeed's own config parser (scripts/deepspeed_check.py says what runs); with --torchtitan
# the TorchTitan exports (NN-NAME.torchtitan.toml) with TorchTitan's ConfigManager and the
# llama3 model it builds (scripts/torchtitan_check.py).
#
# Usage:
#   scripts/megatron-check.sh --setup            # once: venv + torch + DeepSpeed + Megatron-LM
#   scripts/megatron-check.sh --probe            # 0 if set up, else 77 with a "skipped" line
#   scripts/megatron-check.sh DIR/*.megatron.txt # check files (options: see megatron_check.py -h)
#   scripts/megatron-check.sh --deepspeed DIR/*.deepspeed.json
#   scripts/megatron-check.sh --torchtitan DIR/*.torchtitan.toml
#
# --setup installs, under $MEGATRON_CHECK_HOME (default ~/.cache/stepcast-megatron-check):
#   venv/         a Python >= 3.12 virtualenv (Megatron-LM's requires-python) holding
#                 torch==2.13.0 (the version in Megatron-LM's uv.lock at that commit), numpy and
#                 packaging, deepspeed==0.19.8 (its Python package; DS_BUILD_OPS=0 builds
#                 no CUDA ops) and torchtitan==0.2.2, from PyPI (or the index pip is
#                 configured for). PyPI's Linux torch
#                 wheel is the CUDA build: it pulls the nvidia-* CUDA wheels, about 3 GB to
#                 download and 5 GB installed, and imports fine on a machine without a GPU.
#   Megatron-LM/  Megatron-LM's source at $MEGATRON_LM_COMMIT (default d98e8a64ddf3..., the
#                 commit the export cites), a shallow fetch from $MEGATRON_LM_GIT (default
#                 https://github.com/NVIDIA/Megatron-LM; a local clone or mirror works too).
#                 Used from source through PYTHONPATH, not pip-installed.
# It takes 2-5 minutes on a fast link (most of it the torch download); checking takes about
# 5 s to import torch and Megatron, then well under a second per file.
#
# Environment: MEGATRON_CHECK_HOME, MEGATRON_LM_GIT, MEGATRON_LM_COMMIT, PYTHON (interpreter
# for the venv), MEGATRON_PYTHON + MEGATRON_LM (use an existing interpreter, e.g. an NGC
# container's, and a Megatron-LM checkout instead of the venv).
#
# Exit status: 0 every file accepted; 1 some file rejected by Megatron-LM; 2 usage error or a
# file that cannot be read; 77 skipped: torch or Megatron-LM cannot be imported (not set up),
# or a check needed something the CPU stubs do not cover. Output lines start "accepted",
# "rejected", "skipped" or "error".
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
home="${MEGATRON_CHECK_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/stepcast-megatron-check}"
venv="$home/venv"
mlm="${MEGATRON_LM:-$home/Megatron-LM}"
git_src="${MEGATRON_LM_GIT:-https://github.com/NVIDIA/Megatron-LM}"
commit="${MEGATRON_LM_COMMIT:-d98e8a64ddf34856e74b24714e3bedb2f5a39553}"
torch_version="${MEGATRON_CHECK_TORCH:-2.13.0}"
deepspeed_version="${MEGATRON_CHECK_DEEPSPEED:-0.19.8}"
torchtitan_version="${MEGATRON_CHECK_TORCHTITAN:-0.2.2}"

# A Python >= 3.12: $PYTHON, then python3.13/python3.12/python3 on PATH, then pyenv's.
find_python() {
  local c
  for c in ${PYTHON:-} python3.13 python3.12 python3 \
           "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
    if "$c" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}

setup() {
  mkdir -p "$home"
  if [ ! -x "$venv/bin/python" ]; then
    local py
    py="$(find_python)" || { echo "setup: no Python >= 3.12 found (set PYTHON)" >&2; exit 2; }
    echo "setup: creating $venv with $py ($("$py" --version 2>&1))"
    "$py" -m venv "$venv"
  fi
  echo "setup: pip install torch==$torch_version numpy packaging (torch pulls the CUDA wheels)"
  "$venv/bin/python" -m pip install --quiet "torch==$torch_version" numpy packaging
  echo "setup: pip install deepspeed==$deepspeed_version (DS_BUILD_OPS=0: no CUDA ops built)"
  DS_BUILD_OPS=0 "$venv/bin/python" -m pip install --quiet "deepspeed==$deepspeed_version"
  echo "setup: pip install torchtitan==$torchtitan_version (the last release with TOML job configs)"
  "$venv/bin/python" -m pip install --quiet "torchtitan==$torchtitan_version"
  if [ "$(git -C "$mlm" rev-parse HEAD 2>/dev/null || true)" != "$commit" ]; then
    echo "setup: fetching Megatron-LM $commit from $git_src into $mlm"
    rm -rf "$mlm"
    git init -q "$mlm"
    git -C "$mlm" fetch -q --depth 1 "$git_src" "$commit"
    git -C "$mlm" -c advice.detachedHead=false checkout -q FETCH_HEAD
  fi
  echo "setup: done; torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)' \
    2>/dev/null), Megatron-LM $(git -C "$mlm" rev-parse --short=12 HEAD)"
}

if [ "${1:-}" = "--setup" ]; then
  setup
  exit 0
fi
if [ $# -eq 0 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
  [ $# -eq 0 ] && exit 2 || exit 0
fi

python="${MEGATRON_PYTHON:-$venv/bin/python}"
if ! [ -x "$python" ] && ! command -v "$python" >/dev/null 2>&1; then
  echo "skipped: no Python environment for the Megatron-LM check at $python" \
       "(run scripts/megatron-check.sh --setup, or set MEGATRON_PYTHON)"
  exit 77
fi
if [ -d "$mlm/megatron" ]; then
  export PYTHONPATH="$mlm${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ "${1:-}" = "--probe" ]; then
  if "$python" -c 'import torch, megatron.training.arguments' >/dev/null 2>&1; then
    echo "megatron-check: $("$python" -c 'import torch; print("torch", torch.__version__)'), Megatron-LM at $mlm"
    exit 0
  fi
  echo "skipped: torch or Megatron-LM does not import with $python (run scripts/megatron-check.sh --setup)"
  exit 77
fi
if [ "${1:-}" = "--deepspeed" ]; then
  shift
  exec "$python" "$here/deepspeed_check.py" "$@"
fi
if [ "${1:-}" = "--torchtitan" ]; then
  shift
  exec "$python" "$here/torchtitan_check.py" "$@"
fi
exec "$python" "$here/megatron_check.py" "$@"
