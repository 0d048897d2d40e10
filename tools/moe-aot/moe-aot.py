#!/usr/bin/env python3
"""Ahead-of-time compilation of moe functions for NVIDIA GPUs.

  moe-aot.py INPUT.mlir -o OUTDIR [--name NAME] [--chip sm_90] [--format fatbin]
             [--moe-opt PATH] [--llvm-bin DIR] [--toolkit /usr/local/cuda]
             [--link --runtime-dir DIR]

Steps (each output is kept in OUTDIR):
  1. NAME.llvm.mlir : moe-opt --moe-lower-to-nvvm (host LLVM dialect + gpu.binary)
  2. NAME.ll        : mlir-translate --mlir-to-llvmir (the binary is embedded;
                      a global constructor loads it through mgpuModuleLoad)
  3. NAME.o         : llc -filetype=obj -relocation-model=pic
  4. libNAME.so     : (--link) c++ -shared NAME.o -lmoe_cuda_runtime

NAME.o needs nothing of LLVM at run time: only libmoe_cuda_runtime.so (the
mgpu* ABI and moeGpu*), so it can be linked with plain g++ on a machine that
has the CUDA driver but no LLVM. Every public function `f` is callable as
`_mlir_ciface_f` (results first, as a pointer to the result descriptor(s),
then a pointer per memref argument); memref arguments are device memory and
the results are device allocations the caller frees with moeGpuFree.
"""

import argparse
import os
import shutil
import subprocess
import sys


def run(cmd):
    print("+", " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        sys.exit(f"moe-aot: step failed ({proc.returncode}): {' '.join(cmd)}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input")
    ap.add_argument("-o", "--out-dir", required=True)
    ap.add_argument("--name")
    ap.add_argument("--chip", default="sm_90")
    ap.add_argument("--features", default="")
    ap.add_argument("--format", default="fatbin", choices=["isa", "bin", "fatbin"])
    ap.add_argument("--toolkit", default="/usr/local/cuda")
    ap.add_argument("--moe-opt", default=os.path.join(here, "..", "..", "build", "bin", "moe-opt"))
    ap.add_argument("--llvm-bin", default="/usr/lib/llvm-22/bin")
    ap.add_argument("--link", action="store_true", help="also link libNAME.so")
    ap.add_argument("--runtime-dir", help="directory of libmoe_cuda_runtime.so (with --link)")
    ap.add_argument("--cxx", default=shutil.which("c++") or "g++")
    args = ap.parse_args()

    name = args.name or os.path.splitext(os.path.basename(args.input))[0]
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, name)
    pipeline = f"chip={args.chip} format={args.format} toolkit={args.toolkit}"
    if args.features:
        pipeline += f" features={args.features}"
    run([args.moe_opt, args.input, f"--moe-lower-to-nvvm={pipeline}", "-o", base + ".llvm.mlir"])
    run([os.path.join(args.llvm_bin, "mlir-translate"), "--mlir-to-llvmir",
         base + ".llvm.mlir", "-o", base + ".ll"])
    run([os.path.join(args.llvm_bin, "llc"), "-O2", "-filetype=obj", "-relocation-model=pic",
         base + ".ll", "-o", base + ".o"])
    if args.link:
        if not args.runtime_dir:
            sys.exit("moe-aot: --link needs --runtime-dir")
        run([args.cxx, "-shared", "-o", os.path.join(args.out_dir, f"lib{name}.so"), base + ".o",
             "-L" + args.runtime_dir, "-lmoe_cuda_runtime",
             "-Wl,-rpath," + os.path.abspath(args.runtime_dir)])
    print(base + ".o")


if __name__ == "__main__":
    main()
