"""The MLIR tools of the whole-graph path: finding and running ``moe-opt`` / ``mlir-runner``, the build's libraries.

Tool discovery: ``$MOE_OPT`` or ``<repo>/$MOE_BUILD_DIR|build/bin/moe-opt`` or ``moe-opt`` on PATH; ``$MLIR_RUNNER``
or ``/usr/lib/llvm-22/bin/mlir-runner``; runtime libraries next to moe-opt (``<build>/lib``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["MoEOptError", "MoERuntimeError", "find_moe_opt", "find_mlir_runner", "find_runtime_lib", "run_moe_opt",
           "verify", "lower_to_llvm", "LLVM_BIN", "LLVM_LIB", "REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parents[3]
LLVM_BIN = Path("/usr/lib/llvm-22/bin")
LLVM_LIB = Path("/usr/lib/llvm-22/lib")


class MoEOptError(RuntimeError):
    """``moe-opt`` rejected the module (parse, verifier or pass failure); carries its stderr."""


class MoERuntimeError(RuntimeError):
    """The compiled code reported a run-time error (e.g. an index operand out of range)."""


# ----------------------------------------------------------------------------------------------------------------
# Tools
# ----------------------------------------------------------------------------------------------------------------


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


def run_moe_opt(mlir_text: str, args: Sequence[str] = (), *, moe_opt: Optional[str] = None,
                timeout: float = 600) -> str:
    """Runs ``moe-opt <args>`` on ``mlir_text`` and returns its stdout.

    Raises:
        FileNotFoundError: no moe-opt. MoEOptError: a non-zero exit (the message holds moe-opt's diagnostics).
    """
    tool = moe_opt or find_moe_opt()
    if tool is None:
        raise FileNotFoundError("moe-opt not found: build it (cmake --build build) or set MOE_OPT")
    proc = subprocess.run([tool, *args, "-"], input=mlir_text, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise MoEOptError(f"moe-opt {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    return proc.stdout


def verify(mlir_text: str, *, moe_opt: Optional[str] = None) -> None:
    """Parses and verifies ``mlir_text`` with moe-opt (raises :class:`MoEOptError`)."""
    run_moe_opt(mlir_text, [], moe_opt=moe_opt)


def lower_to_llvm(mlir_text: str, *, moe_opt: Optional[str] = None) -> str:
    """``moe-opt --canonicalize --moe-lower-to-llvm``: the LLVM-dialect module."""
    return run_moe_opt(mlir_text, ["--canonicalize", "--moe-lower-to-llvm"], moe_opt=moe_opt)
