#!/usr/bin/env bash
# The Python package's tests (issue 31), ctest `python.package`: a fresh venv, `pip install .`
# building in this ctest's own tree (so nothing memc already built is built again), PyTorch from
# PyPI for the torch-module tests (pip's cache keeps later runs fast), then pytest.
#   bash tests/python/run.sh BUILD_DIR
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
venv=$BUILD/python-test-venv
rm -rf "$venv"
python3 -m venv "$venv"
pip() { "$venv/bin/python" -m pip -q --disable-pip-version-check "$@"; }
pip install scikit-build-core nanobind numpy pytest
(cd "$SRC" && pip install --no-build-isolation -C build-dir="$BUILD" .)
# PyPI's Linux torch wheel is the CUDA build: without its CUDA wheels it still imports and runs on
# the CPU once these four are there (models/README.md); onnx for torch's exporter.
pip install --no-deps torch==2.15.0
pip install filelock typing-extensions sympy mpmath networkx jinja2 MarkupSafe fsspec onnx
pip install --no-deps "nvidia-cufile==1.17.*" "nvidia-cusparselt-cu13==0.8.1" "nvidia-nvshmem-cu13==3.7.2" "nvidia-nccl-cu13==2.30.7"
# The model families users bring (tests/python/families.py): transformers' vision models and
# torchvision's (its wheel pins the CUDA torch, so without its dependencies), and onnxscript for
# torch's dynamo exporter, memc.compile's first choice.
pip install --no-deps torchvision==0.29.2
pip install pillow transformers==5.25.0 onnxscript
"$venv/bin/python" -c 'import torch, transformers, memc; print("torch", torch.__version__, "transformers", transformers.__version__, "memc", memc.__version__, memc.__file__)'
cd "$BUILD"
export MEMC_TEST_BUILD="$BUILD"
exec "$venv/bin/python" -m pytest -q -p no:warnings -p no:cacheprovider "$SRC/tests/python"
