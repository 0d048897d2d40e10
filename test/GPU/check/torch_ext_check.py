#!/usr/bin/env python3
"""Step torch-ext of the GPU check (gpu_check.py), no GPU needed: the torch extension that the build step made
(libmoe_torch.so, $MOE_TORCH_LIB, against this machine's torch) loads through the checkout's moe_mlir package, was
built with its CUDA kernels, registers them, and every op whose kernels scripts/gpu-check.sh prebuilt (the keys in
$MOE_KERNEL_PREBUILT/keys.txt) then has a CUDA kernel in the dispatcher. It runs in the self-test here, so that an
extension that does not build or load with the folder's sources fails the test command rather than a GPU session.
Exit status: 0 pass, 1 fail (the reason printed last)."""

import os
import sys


def fail(why):
    print(f"torch-ext: FAIL: {why}")
    return 1


def main():
    import torch

    lib_path = os.environ["MOE_TORCH_LIB"]
    from moe_mlir import ops
    from moe_mlir.runtime import extension

    if not ops._EXTENSION_LOADED:
        return fail(f"the extension does not load: {ops._KERNELS_UNAVAILABLE}")
    if os.path.realpath(extension.library_path) != os.path.realpath(lib_path):
        return fail(f"moe_mlir loaded {extension.library_path}, not the folder's build {lib_path}")
    lib = extension._lib
    if not hasattr(lib, "moeTorchEnableCuda"):
        return fail("libmoe_torch.so was built without its CUDA kernels (no CUDA runtime target at configure time)")
    if extension.cuda_unavailable is not None:
        # No device here (the self-test): register the CUDA kernels by hand, as extension.load does with one.
        print(f"torch-ext: the CUDA kernels were not enabled by moe_mlir ({extension.cuda_unavailable}); "
              "registering them")
        lib.moeTorchEnableCuda.restype = __import__("ctypes").c_int32
        if lib.moeTorchEnableCuda() != 0:
            return fail("moeTorchEnableCuda() failed (see above)")
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("moe::"))
    if not names:
        return fail("no moe:: op is registered")
    no_cpu = [n for n in names if not torch._C._dispatch_has_kernel_for_dispatch_key(n, "CPU")]
    keys = os.path.join(os.environ.get("MOE_KERNEL_PREBUILT", ""), "keys.txt")
    from moe_mlir.runtime.cache import cuda_kernel_op

    # keys.txt is what the CPU run recorded; prebuild_cuda leaves out the ops registered for the CPU only.
    recorded = {line.split("|")[0] for line in open(keys) if line.strip()} if os.path.exists(keys) else set()
    prebuilt = sorted(op for op in recorded if cuda_kernel_op(op))
    no_cuda = [op for op in prebuilt if not torch._C._dispatch_has_kernel_for_dispatch_key(f"moe::{op}", "CUDA")]
    print(f"torch-ext: {lib_path} (torch {torch.__version__}): {len(names)} moe ops; prebuilt kernels of "
          f"{', '.join(prebuilt) or 'no op'}")
    if no_cpu:
        return fail(f"ops without a CPU kernel: {no_cpu}")
    if no_cuda:
        return fail(f"ops with prebuilt kernels but no CUDA kernel registered: {no_cuda}")
    print("torch-ext: pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
