"""Where the build's tools and libraries are: the lowest layer, used by the runtime (kernel cache, torch extension)
and by the backends alike.

Tool discovery: ``$MOE_OPT`` or ``<repo>/$MOE_BUILD_DIR|build/bin/moe-opt`` or ``moe-opt`` on PATH; ``$MLIR_RUNNER``
or ``/usr/lib/llvm-22/bin/mlir-runner``; runtime libraries next to moe-opt (``<build>/lib``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

__all__ = ["find_moe_opt", "find_mlir_runner", "find_runtime_lib", "LLVM_BIN", "LLVM_LIB", "REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parents[3]
LLVM_BIN = Path("/usr/lib/llvm-22/bin")
LLVM_LIB = Path("/usr/lib/llvm-22/lib")


def _build_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("MOE_BUILD_DIR"):
        d = Path(os.environ["MOE_BUILD_DIR"])
        dirs.append(d if d.is_absolute() else REPO_ROOT / d)
    dirs += [REPO_ROOT / "build", REPO_ROOT / "build-py"]
    return dirs


def find_moe_opt() -> Optional[str]:
    """Path of a usable ``moe-opt`` or None."""
    env = os.environ.get("MOE_OPT")
    if env:
        return env if os.access(env, os.X_OK) else None
    for d in _build_dirs():
        p = d / "bin" / "moe-opt"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return shutil.which("moe-opt")


def find_mlir_runner() -> Optional[str]:
    env = os.environ.get("MLIR_RUNNER")
    if env:
        return env
    p = LLVM_BIN / "mlir-runner"
    if p.is_file():
        return str(p)
    return shutil.which("mlir-runner-22") or shutil.which("mlir-runner")


def find_runtime_lib(name: str) -> Optional[str]:
    moe_opt = find_moe_opt()
    cands = []
    if moe_opt:
        cands.append(Path(moe_opt).resolve().parents[1] / "lib" / name)
    cands += [d / "lib" / name for d in _build_dirs()]
    for c in cands:
        if c.is_file():
            return str(c)
    return None
