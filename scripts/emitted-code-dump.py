#!/usr/bin/env python3
"""Dumps the code the compiler emits for every lit input, so that a refactoring can be checked to change none of it.

  scripts/emitted-code-dump.py OUT [--moe-opt build/bin/moe-opt] [--jobs 2] [--input-root DIR] [INPUT.mlir...]
  diff -r BEFORE OUT            (empty: byte-identical emitted code)

Each input (default: test/Conversion/**, test/Pipelines, test/GPU/Inputs) is split at `// -----` like
`moe-opt --split-input-file` (chunks that expect a diagnostic are skipped) and each chunk is lowered
  - for the CPU: `moe-opt --moe-lower-to-llvm=num-threads=2 | mlir-translate --mlir-to-llvmir`   -> NAME.cpu.ll
    and with the AVX-512 lanes (`target-cpu=x86-64-v4`)                                            -> NAME.v4.ll
    and through the portable lowering alone (`cpu-kernels=false`: convert-moe-to-linalg)             -> NAME.portable.ll
  - for the GPU: `moe-opt --moe-lower-to-nvvm="chip=sm_90 format=isa"`, its PTX                   -> NAME.sm_90.N.ptx
    and `ptxas -v -O3` of each PTX (registers, spills, shared memory)                                -> NAME.sm_90.N.ptxas
    plus the topk-rounds=butterfly variant for the inputs that select it.
A lowering that fails stores its diagnostics (NAME.*.err) instead, so failures are compared too.
"""
import argparse
import concurrent.futures
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
from ptxas_report import extract_ptx  # noqa: E402

DEFAULT_INPUTS = ["test/Conversion/**/*.mlir", "test/Pipelines/*.mlir", "test/GPU/Inputs/*.mlir"]


def chunks(path, root):
    rel = os.path.relpath(path, root).replace("/", "_")[:-len(".mlir")]
    with open(path) as f:
        parts = re.split(r"^// -----.*$", f.read(), flags=re.M)
    return [(f"{rel}.{n}", c) for n, c in enumerate(parts) if "expected-" not in c]


def run(cmd, text):
    p = subprocess.run(cmd, input=text, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def lower(job):
    name, text, out, opts = job
    moe_opt, translate, ptxas = opts
    written = []

    def put(suffix, data):
        with open(os.path.join(out, f"{name}.{suffix}"), "w") as f:
            f.write(data)
        written.append(suffix)

    for tag, pipe in (("cpu", "--moe-lower-to-llvm=num-threads=2"),
                      ("v4", "--moe-lower-to-llvm=num-threads=2 target-cpu=x86-64-v4"),
                      ("portable", "--moe-lower-to-llvm=num-threads=2 cpu-kernels=false")):
        rc, mlir, err = run([moe_opt, "-", pipe], text)
        if rc:
            put(f"{tag}.err", err)
            continue
        rc, ll, err = run([translate, "--mlir-to-llvmir"], mlir)
        put(f"{tag}.ll" if rc == 0 else f"{tag}.err", ll if rc == 0 else err)
    variants = [("sm_90", "")]
    if "topk" in name or "route" in name:
        variants.append(("sm_90-butterfly", "topk-rounds=butterfly"))
    for tag, extra in variants:
        rc, lowered, err = run([moe_opt, "-", f"--moe-lower-to-nvvm=chip=sm_90 format=isa {extra}".strip()], text)
        if rc:
            put(f"{tag}.err", err)
            continue
        for n, ptx in enumerate(extract_ptx(lowered)):
            put(f"{tag}.{n}.ptx", ptx)
            path = os.path.join(out, f"{name}.{tag}.{n}.ptx")
            p = subprocess.run([ptxas, "-v", "-arch=sm_90", "-O3", path, "-o", "/dev/null"],
                               capture_output=True, text=True)
            report = (p.stdout + p.stderr).replace(path, f"{name}.{tag}.{n}.ptx")
            put(f"{tag}.{n}.ptxas", re.sub(r"^.*Compile time = .*\n", "", report, flags=re.M))
    return name, written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("inputs", nargs="*")
    ap.add_argument("--moe-opt", default=os.path.join(ROOT, "build", "bin", "moe-opt"))
    ap.add_argument("--mlir-translate", default="/usr/lib/llvm-22/bin/mlir-translate")
    ap.add_argument("--ptxas", default="/usr/local/cuda/bin/ptxas")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--input-root", default=ROOT,
                    help="the folder the default inputs are globbed in and outputs named after (a saved copy of the "
                         "inputs of the 'before' run keeps the comparison to the same inputs)")
    args = ap.parse_intermixed_args()
    inputs = args.inputs or sorted(p for g in DEFAULT_INPUTS for p in glob.glob(os.path.join(args.input_root, g), recursive=True))
    os.makedirs(args.out, exist_ok=True)
    opts = (args.moe_opt, args.mlir_translate, args.ptxas)
    jobs = [(name, text, args.out, opts) for p in inputs for name, text in chunks(os.path.abspath(p), args.input_root)]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
        files = sum(len(w) for _, w in ex.map(lower, jobs))
    print(f"emitted-code-dump: {len(jobs)} chunks of {len(inputs)} inputs, {files} files -> {args.out}")


if __name__ == "__main__":
    main()
