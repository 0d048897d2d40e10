"""``import moe_mlir`` stays light: it registers ``torch.ops.moe.*`` but imports neither ``torch._dynamo`` (2-3 s, and
torch's import-time log lines) nor an MLIR/LLVM library, and ``torch.compile(backend="moe")`` still finds the
backend (through the package's ``torch_dynamo_backends`` entry point). Checked in a fresh interpreter, by what is
imported, not by time."""

from __future__ import annotations

import json
import subprocess
import sys


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _installed() -> bool:
    """An installed (or editable) package has the entry point; on PYTHONPATH only, ``import moe_mlir`` registers the
    backend itself and so imports torch._dynamo."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("moe_mlir")
    except PackageNotFoundError:
        return False
    return True


def test_import_loads_no_dynamo_and_no_llvm() -> None:
    got = _fresh("import json, sys, torch, moe_mlir\n"
                 "maps = open('/proc/self/maps').read()\n"
                 "print(json.dumps({'dynamo': 'torch._dynamo' in sys.modules, 'ops': hasattr(torch.ops.moe, "
                 "'topk_renorm'), 'llvm': 'libLLVM' in maps or 'libMLIR' in maps, 'sympy': 'sympy' in sys.modules}))")
    # sympy (~0.3 s to import) only when a graph is raised: torch itself imports it lazily too.
    assert got == {"dynamo": not _installed(), "ops": True, "llvm": False, "sympy": False}


def test_backend_string_resolves_after_a_light_import() -> None:
    got = _fresh("import json, torch, moe_mlir\n"
                 "f = torch.compile(lambda x: torch.softmax(x, -1).topk(2, -1), backend='moe')\n"
                 "w, i = f(torch.randn(5, 8))\n"
                 "from moe_mlir.backends.dynamo import moe_backend\n"
                 "from torch._dynamo.backends.registry import lookup_backend\n"
                 "print(json.dumps({'same': lookup_backend('moe') is moe_backend, 'shape': list(w.shape)}))")
    assert got == {"same": True, "shape": [5, 2]}
