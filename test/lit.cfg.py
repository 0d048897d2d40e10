# -*- Python -*- lit configuration of the MoE-MLIR regression tests.

import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "MOE"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".td"]
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "Inputs"]

config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.moe_obj_root, "test")

# Unused FileCheck prefixes and variables leaking across CHECK-LABELs are bugs in a test.
config.environment["FILECHECK_OPTS"] = "-enable-var-scope --allow-unused-prefixes=false"

config.substitutions.append(("%PATH%", config.environment["PATH"]))
llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)

# The MLIR runner support libraries that Integration tests pass to mlir-runner.
for lib in ["mlir_c_runner_utils", "mlir_runner_utils"]:
    config.substitutions.append(
        ("%" + lib, os.path.join(config.llvm_lib_dir, "lib" + lib + ".so")))

# Our runtime (run-time index errors), for Integration tests that exercise them.
config.substitutions.append(
    ("%moe_cpu_runtime", os.path.join(config.moe_obj_root, "lib", "libmoe_cpu_runtime.so")))

# The tensor-core flash kernel of one row tile a warp (64 rows a block) without split keys: the FileCheck tests of
# that kernel's IR start from it (the default since the H200 run of 2026-11-26 is the 128-row kernel with 4 key
# splits, the lazy rescale and 3 stages: similarity_inform_mma_block_rows.mlir).
config.substitutions.append(("%flash_base64", "flash-mma-block-rows=64 flash-mma-key-splits=1"))
config.substitutions.append(("%moe_obj_root", config.moe_obj_root))
config.substitutions.append(("%moe_src_root", config.moe_src_root))
# The -I flags that moe-tblgen needs for the project's and MLIR's .td files (test/Tools/moe-tblgen-*.td).
config.substitutions.append(("%tblgen_includes", " ".join(
    "-I " + d for d in [config.moe_src_root + "/include"] + config.mlir_include_dir.split(";") if d)))

# `asan`: this build is instrumented with AddressSanitizer (scripts/sanitize.sh). Its shadow memory and quarantine
# raise every process's peak RSS, so memory-footprint checks hold only without it (`%if !asan %{ ... %}`); the
# numerics around them still run.
if "-fsanitize=address" in getattr(config, "moe_cxx_flags", ""):
    config.available_features.add("asan")

tool_dirs = [config.moe_tools_dir, config.llvm_tools_dir]
tools = ["moe-opt", "moe-tblgen", ToolSubst("mlir-runner", unresolved="ignore")]
llvm_config.add_tool_substitutions(tools, tool_dirs)

# GPU path (lib/Conversion/MoEToGPU, lib/Runtime/CUDA): `ptxas` when the CUDA
# toolkit is installed (bin/fatbin formats, the ptxas report); `cuda-gpu` when
# a device is visible (the tests that run kernels; UNSUPPORTED otherwise).
import shutil
import subprocess
moe_cuda_toolkit = os.environ.get("MOE_CUDA_TOOLKIT", "/usr/local/cuda")
moe_ptxas = os.path.join(moe_cuda_toolkit, "bin", "ptxas")
if os.path.exists(moe_ptxas):
    config.available_features.add("ptxas")
config.substitutions.append(("%ptxas", moe_ptxas))
config.substitutions.append(("%cuda_toolkit", moe_cuda_toolkit))
# bench/gpu/ptxas_report.py's ptxas runs go through bench/gpu/ptxas_cache.py: PTX that several GPU tests assemble
# for the same chip and flags (the route kernels' chunks of ptxas-sweep and ptxas-route-*) goes through ptxas once
# per build folder. The key is the PTX, the flags and the ptxas binary; a failed run is cached as a failure.
# MOE_PTXAS_CACHE= (empty) in lit's environment turns it off.
config.environment["MOE_PTXAS_CACHE"] = os.environ.get(
    "MOE_PTXAS_CACHE", os.path.join(config.moe_obj_root, "test", "GPU", ".ptxas-cache"))
# `nvdisasm` (the kernels' SASS: GPU/sass-budget.mlir): $MOE_NVDISASM, the PyPI wheel nvidia-cuda-nvdisasm that
# scripts/install-python.sh installs into .venv, the CUDA toolkit's, or PATH's. The test command installs the
# wheel, so where ptxas is found and nvdisasm is not, the budget would be skipped unnoticed: lit warns, and under
# CI (CI=true) stops.
import glob
def _moe_find_nvdisasm():
    candidates = [os.environ.get("MOE_NVDISASM", "")]
    candidates += sorted(glob.glob(os.path.join(config.moe_src_root, ".venv", "lib", "python*", "site-packages",
                                                "nvidia", "cu*", "bin", "nvdisasm")), reverse=True)
    candidates += [os.path.join(moe_cuda_toolkit, "bin", "nvdisasm"), shutil.which("nvdisasm") or ""]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)
moe_nvdisasm = _moe_find_nvdisasm()
if moe_nvdisasm:
    config.available_features.add("nvdisasm")
elif os.path.exists(moe_ptxas):
    msg = ("nvdisasm not found (scripts/install-python.sh installs nvidia-cuda-nvdisasm into .venv): "
           "GPU/sass-budget.mlir, the kernels' SASS budget, is UNSUPPORTED")
    if os.environ.get("CI") == "true":
        lit_config.fatal(msg)
    lit_config.warning(msg)
config.substitutions.append(("%nvdisasm", moe_nvdisasm or "nvdisasm"))
moe_venv_python = os.path.join(config.moe_src_root, ".venv", "bin", "python")
config.substitutions.append(
    ("%moe_python", moe_venv_python if os.path.exists(moe_venv_python) else config.python_executable))
config.substitutions.append(("%python", config.python_executable))
def _moe_has_cuda_device():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except Exception:
        return False
    return "GPU " in out
if _moe_has_cuda_device():
    config.available_features.add("cuda-gpu")
