"""The CPU a benchmark run compiles for, pinned before torch (and our kernels) read it.

``--target native|x86-64-v3|x86-64-v4|<an LLVM x86-64 CPU name>`` (default native): our JIT compiles for that CPU
(``$MOE_TARGET_CPU``, the execution API's ``target-cpu``: the kernels' vector width and the instructions LLVM may
use), so an AVX-512 machine can measure the AVX2 code of x86-64-v3. The baselines are held to the same instruction
set where their libraries allow it, so that the comparison is the one an AVX2 machine would see: PyTorch's kernels
(``ATEN_CPU_CAPABILITY``), MKL (``MKL_ENABLE_INSTRUCTIONS``), oneDNN (``ONEDNN_MAX_CPU_ISA``) and OpenBLAS
(``OPENBLAS_CORETYPE``). Variables already set in the environment are kept.
"""

from __future__ import annotations

import os
import sys

#: Per x86-64 level: the environment of the baselines' libraries.
_LIBRARY_ISA = {
    "x86-64-v3": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                  "OPENBLAS_CORETYPE": "Haswell"},
    "x86-64-v4": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512",
                  "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "OPENBLAS_CORETYPE": "SkylakeX"},
}
LIBRARY_VARIABLES = ("MOE_TARGET_CPU", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                     "OPENBLAS_CORETYPE")


def target_from_argv(default: str) -> str:
    """``--target T`` or ``--target=T`` from the command line (argparse parses it again later), else ``default``."""
    for i, a in enumerate(sys.argv):
        if a == "--target" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--target="):
            return a.split("=", 1)[1]
    return default


def pin_target(default: str = "native") -> str:
    """Sets ``MOE_TARGET_CPU`` and the baselines' instruction-set variables for the run's target; returns it."""
    target = target_from_argv(os.environ.get("MOE_TARGET_CPU") or default)
    os.environ["MOE_TARGET_CPU"] = target
    for var, value in _LIBRARY_ISA.get(target, {}).items():
        os.environ.setdefault(var, value)
    if target in _LIBRARY_ISA and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        # inductor's compiled baselines per target: a kernel cached by a run at another level (or by a run with other
        # library variables) crashed the x86-64-v3 suite (segfault in the attention baseline's fused C++ kernel,
        # gone with a fresh cache).
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor-moe-bench-{target}")
    return target


def target_info(target: str) -> dict:
    """What the run's JSON records about the target (after torch is imported)."""
    import torch

    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001
        capability = None
    return {"cpu": target, "vector_bits": {"x86-64-v3": 256, "x86-64-v4": 512}.get(target),
            "torch_cpu_capability": capability, "env": {v: os.environ.get(v) for v in LIBRARY_VARIABLES}}
