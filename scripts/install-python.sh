#!/usr/bin/env bash
# Installs PyTorch (pinned) into the project venv .venv/ from PyPI. Idempotent: does nothing when .venv already has
# torch at the pinned version and `import torch` works.
#
# The venv serves two users:
#   * Python (python/): `import torch`, pytest;
#   * C++ (unittests/Reference): the libtorch inside the wheel, torch/{include,lib} (libtorch_cpu.so, libc10.so),
#     which needs no CUDA library at all.
#
# PyPI only has CUDA builds of torch for Linux; `pip install torch` pulls ~3.5 GB of nvidia-* CUDA 13 wheels
# (5.3 GB venv, ~2 min here). The default "lean" mode installs the torch wheel without its dependencies, its
# pure-Python dependencies, and only the four CUDA libraries that torch's Python extension links and that the
# machine's CUDA 13 toolkit (/usr/local/cuda, in ld.so.conf) lacks or has too old (cuFile, cuSPARSELt, NVSHMEM,
# NCCL): a ~2 GB venv, ~40 s. If `import torch` then fails (no CUDA toolkit on the machine), it falls back to the
# full install. MOE_TORCH_INSTALL=full forces the full install.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MOE_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
TORCH_VERSION=2.15.0
MODE="${MOE_TORCH_INSTALL:-lean}"

# torch 2.15.0's Requires-Dist: the pure-Python ones, and the CUDA wheels the lean mode still needs.
PURE_DEPS=(filelock 'typing-extensions>=4.13.0' 'setuptools>=77.0.3' 'sympy>=1.13.3' 'networkx>=2.5.1' jinja2
           'fsspec>=0.8.5')
LEAN_CUDA_DEPS=('nvidia-cufile==1.17.1.22.*' 'nvidia-cusparselt-cu13==0.8.1' 'nvidia-nvshmem-cu13==3.7.2'
                'nvidia-nccl-cu13==2.30.7')
# Used by the Python tests and reference code. transformers: the acceptance tests compile HF's own sparse-MoE blocks
# (tiny configs, random weights, nothing downloaded); 5.23.0 is the release tested with torch 2.15.
TRANSFORMERS_VERSION=5.23.0
# nvdisasm (and cuobjdump) of the CUDA toolkit, which the machine's toolkit lacks: the lit test GPU/sass-budget.mlir
# reads the kernels' SASS with it (bench/gpu/sass_budget.py; test/lit.cfg.py finds it in .venv).
NVDISASM_VERSION=13.5.37
# auditwheel: python/tests/test_wheel.py checks the wheel's manylinux tag against what its pieces link.
AUDITWHEEL_VERSION=6.8.2
EXTRA=(numpy 'pytest>=7' "transformers==$TRANSFORMERS_VERSION" "nvidia-cuda-nvdisasm==$NVDISASM_VERSION"
       "nvidia-cuda-cuobjdump==$NVDISASM_VERSION" "auditwheel==$AUDITWHEEL_VERSION")

torch_ok() {
  [ -x "$PY" ] || return 1
  "$PY" - "$TORCH_VERSION" <<'EOF' >/dev/null 2>&1
import sys, os, torch
want = sys.argv[1]
assert torch.__version__.split("+")[0] == want, torch.__version__
lib = os.path.join(os.path.dirname(torch.__file__), "lib")
assert os.path.exists(os.path.join(lib, "libtorch_cpu.so"))
assert float(torch.tensor([1.0, 2.0]).sum()) == 3.0
EOF
}

extras_ok() {
  "$PY" - "$TRANSFORMERS_VERSION" <<'EOF' >/dev/null 2>&1
import sys, os
os.environ["HF_HUB_OFFLINE"] = "1"
import numpy, pytest, transformers, auditwheel
assert transformers.__version__ == sys.argv[1], transformers.__version__
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
import glob, subprocess, sysconfig
nvdisasm = glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cu*", "bin", "nvdisasm"))
assert nvdisasm and subprocess.run([nvdisasm[0], "--version"], capture_output=True).returncode == 0
EOF
}

if torch_ok; then
  if ! extras_ok; then
    echo "== python: installing the test dependencies (${EXTRA[*]})"
    "$PY" -m pip --disable-pip-version-check install -q "${EXTRA[@]}"
  fi
  echo "== python: $VENV already has torch $TORCH_VERSION and the test dependencies"
  exit 0
fi

if [ ! -x "$PY" ]; then
  echo "== python: creating $VENV"
  python3 -m venv "$VENV"
fi
PIP=("$PY" -m pip --disable-pip-version-check)

start=$(date +%s)
if [ "$MODE" = lean ]; then
  echo "== python: installing torch $TORCH_VERSION (lean: no bundled CUDA stack)"
  "${PIP[@]}" install -q --no-deps "torch==$TORCH_VERSION" "${LEAN_CUDA_DEPS[@]}"
  "${PIP[@]}" install -q "${PURE_DEPS[@]}" "${EXTRA[@]}"
  if ! torch_ok; then
    echo "== python: 'import torch' fails with the machine's CUDA libraries; installing torch's full dependency set"
    MODE=full
  fi
fi
if [ "$MODE" = full ]; then
  echo "== python: installing torch $TORCH_VERSION with all its dependencies (~3.5 GB of CUDA wheels)"
  "${PIP[@]}" install -q "torch==$TORCH_VERSION" "${EXTRA[@]}"
fi

if ! torch_ok; then
  echo "error: torch $TORCH_VERSION does not import from $VENV:" >&2
  "$PY" -c "import torch" >&2 || true
  exit 1
fi
echo "== python: torch $TORCH_VERSION ready in $VENV ($MODE, $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1))"
