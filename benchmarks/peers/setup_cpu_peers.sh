#!/usr/bin/env bash
# Installs the CPU decode peers of benchmarks/generate_cpu.py into venvs under DIR (outside the
# repository): DIR/genai (onnxruntime-genai 0.18 and what its model builder imports) and DIR/llama
# (llama-cpp-python 0.3.36, which builds llama.cpp from source with CMake: a native CPU build,
# about 20-30 minutes on 2 cores).
#
#   bash benchmarks/peers/setup_cpu_peers.sh /work/venvs [genai|llama|all]
#   python benchmarks/generate_cpu.py --genai-python DIR/genai/bin/python \
#       --llama-cpp-python DIR/llama/bin/python --genai-int4-blocks 32,128 --rounds 5
#
# torch==2.14.1 is pinned because that is the wheel on local disk here (passctl's venv has the
# same); an unpinned torch would download a different build.
set -euo pipefail
DIR=${1:?usage: setup_cpu_peers.sh DIR [genai|llama|all]}
WHAT=${2:-all}
PY=${PYTHON:-python3.11}
mkdir -p "$DIR"
if [[ $WHAT == genai || $WHAT == all ]]; then
  "$PY" -m venv "$DIR/genai"
  "$DIR/genai/bin/pip" install onnxruntime-genai==0.18.0 torch==2.14.1 transformers onnx onnx_ir \
    safetensors sentencepiece
fi
if [[ $WHAT == llama || $WHAT == all ]]; then
  "$PY" -m venv "$DIR/llama"
  "$DIR/llama/bin/pip" install --upgrade pip
  CMAKE_ARGS="-DGGML_NATIVE=ON" nice -n 10 "$DIR/llama/bin/pip" install --no-cache-dir \
    llama-cpp-python==0.3.36 numpy
fi
