#!/usr/bin/env python3
"""Ahead-of-time compilation of moe functions for NVIDIA GPUs.

  moe-aot.py INPUT.mlir -o OUTDIR [--name NAME] [--chip sm_90] [--format fatbin]
             [--moe-opt PATH] [--llvm-bin DIR] [--toolkit /usr/local/cuda]
             [--canonicalize] [--pipeline-options OPTS] [--link --runtime-dir DIR]

The command-line tool of the GPU check (scripts/gpu-check.sh, test/GPU):
objects, LLVM IR, PTX fallbacks and manifests, built here with LLVM's tools
and linked on a GPU machine without LLVM (test/GPU/device). The package's own
CUDA products (the torch.ops.moe kernels, prebuilt or not, and the
whole-graph CUDA split) come from one recipe in process instead,
moe_mlir.runtime.driver.build_cuda_library, which makes only linked shared
objects: it is not a recipe behind this script, which stays stdlib-only so
that the bundle runs it (and check_artifacts.py imports it) without the
package.

Steps (each output is kept in OUTDIR):
  1. NAME.llvm.mlir : moe-opt [--canonicalize] --moe-lower-to-nvvm (host LLVM
                      dialect + gpu.binary)
  2. NAME.ll        : mlir-translate --mlir-to-llvmir (the binary is embedded;
                      a global constructor loads it through mgpuModuleLoad)
  3. NAME.o         : llc -filetype=obj -relocation-model=pic (--drop-intermediates
                      then removes NAME.llvm.mlir and NAME.ll)
  4. libNAME.so     : (--link) c++ -shared NAME.o -lmoe_cuda_runtime
  5. (--ptx-fallback) NAME-ptx/moe-<fnv1a64 of the embedded binary>.ptx: the
     uncompressed PTX of each embedded binary (PTX ISA of --features, default
     8.0 = CUDA 12.0), which libmoe_cuda_runtime JIT-compiles when the driver
     rejects the binary (a driver older than the toolkit, a newer chip) and
     MOE_CUDA_PTX_DIR names NAME-ptx (MOE_CUDA_FORCE_PTX=1 forces that path).
     The input is lowered once, to PTX (format=isa), and step 1's binaries are
     assembled from that PTX here, with the pipeline's own ptxas and fatbinary
     arguments: the fallback is the PTX the binary was made from;
  6. NAME.manifest.json (always): the toolkit (ptxas/fatbinary versions), the
     chip, format and PTX ISA, the driver the binary and the PTX need, the
     fatbinary's entries (cubin/PTX, compressed or not), every file's sha256.

NAME.o needs nothing of LLVM at run time: only libmoe_cuda_runtime.so (the
mgpu* ABI and moeGpu*), so it can be linked with plain g++ on a machine that
has the CUDA driver but no LLVM. Every public function `f` is callable as
`_mlir_ciface_f` (results first, as a pointer to the result descriptor(s),
then a pointer per memref argument); memref arguments are device memory and
the results are device allocations the caller frees with moeGpuFree.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile


def run(cmd):
    print("+", " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        sys.exit(f"moe-aot: step failed ({proc.returncode}): {' '.join(cmd)}")


# PTX ISA version -> the CUDA release (and so the driver) that first reads it.
PTX_ISA_CUDA = {"7.8": "11.8", "8.0": "12.0", "8.1": "12.1", "8.2": "12.2", "8.3": "12.3",
                "8.4": "12.4", "8.5": "12.5", "8.6": "12.7", "8.7": "12.8", "8.8": "12.9",
                "9.0": "13.0", "9.1": "13.1"}

FATBIN_MAGIC = 0xBA55ED50


def fnv1a64(data):
    """The module key libmoe_cuda_runtime computes over mgpuModuleLoad's blob."""
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def llvm_binaries(ll_text):
    """{symbol: bytes} of the `@X_binary = internal constant [N x i8] c"..."`
    globals that the gpu.binary embedding emits."""
    out = {}
    for m in re.finditer(r'^@(\S+_binary) = internal constant \[(\d+) x i8\] c"((?:[^"\\]|\\\\|\\[0-9A-Fa-f]{2})*)"',
                         ll_text, re.M):
        # LLVM escapes a byte as \XX, a backslash as \\.
        raw = re.sub(rb"\\(\\|[0-9A-Fa-f]{2})",
                     lambda h: b"\\" if h.group(1) == b"\\" else bytes([int(h.group(1), 16)]),
                     m.group(3).encode("latin-1"))
        if len(raw) != int(m.group(2)):
            sys.exit(f"moe-aot: cannot decode {m.group(1)} ({len(raw)} != {m.group(2)} bytes)")
        out[m.group(1)] = raw
    return out


def fatbin_entries(blob):
    """The entries of a fatbinary: [{kind, sm, compressed, bytes}] ([] if not one)."""
    if len(blob) < 16 or struct.unpack_from("<I", blob, 0)[0] != FATBIN_MAGIC:
        return []
    _, _, header, size = struct.unpack_from("<IHHQ", blob, 0)
    entries, p, end = [], header, header + size
    while p + 64 <= end:
        kind, _, eh, padded = struct.unpack_from("<HHIQ", blob, p)
        sm = struct.unpack_from("<I", blob, p + 28)[0]
        flags = struct.unpack_from("<Q", blob, p + 40)[0]
        payload = blob[p + eh:p + eh + 4]
        compressed = bool(flags & 0x2000) or payload == b"\x28\xb5\x2f\xfd"  # zstd frame
        entries.append({"kind": {1: "ptx", 2: "cubin"}.get(kind, str(kind)), "sm": sm,
                        "compressed": compressed, "bytes": padded})
        p += eh + padded
    return entries


def tool_version(path):
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return None
    m = re.search(r"release ([0-9.]+), V([0-9.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1] if out.strip() else None


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def lower(args, fmt, base, translate=True):
    """Steps 1 and 2 for the gpu.binary format `fmt`: base.llvm.mlir, then (translate) base.ll."""
    pipeline = f"chip={args.chip} format={fmt} toolkit={args.toolkit}"
    if args.features:
        pipeline += f" features={args.features}"
    if args.pipeline_options:
        pipeline += f" {args.pipeline_options}"
    pre = ["--canonicalize"] if args.canonicalize else []
    run([args.moe_opt, args.input, *pre, f"--moe-lower-to-nvvm={pipeline}", "-o", base + ".llvm.mlir"])
    if translate:
        translate_to_llvmir(args, base)


def translate_to_llvmir(args, base):
    run([os.path.join(args.llvm_bin, "mlir-translate"), "--mlir-to-llvmir", base + ".llvm.mlir",
         "-o", base + ".ll"])


# A gpu.binary of the format=isa lowering: its symbol and its one object (the NVVM target, the PTX as an MLIR
# string literal; properties: the serializer's timings and O, which only the JIT load of format=isa reads).
ISA_BINARY_RE = re.compile(r'gpu\.binary @(\S+)\s+\[#gpu\.object<(#nvvm\.target<[^>]*>)'
                           r'(?:, properties = \{[^}]*\})?, assembly = "((?:[^"\\]|\\.)*)">\]')
MLIR_ESCAPES = {"\\": b"\\", '"': b'"', "n": b"\n", "t": b"\t"}
MLIR_STRING_BYTE = [chr(b) if 0x20 <= b < 0x7f and chr(b) not in '"\\' else f"\\{b:02X}" for b in range(256)]


def mlir_string_bytes(literal):
    """The bytes of an MLIR string literal's body (escapes: \\XX, \\\\, \\", \\n, \\t)."""
    return re.sub(rb'\\([\\"nt]|[0-9A-Fa-f]{2})',
                  lambda m: MLIR_ESCAPES.get(m.group(1).decode(), None) or bytes([int(m.group(1), 16)]),
                  literal.encode("latin-1"))


def assemble_isa_binaries(args, base):
    """Steps 1 and 2 from one lowering when the PTX is kept (--ptx-fallback): the input is lowered to PTX
    (format=isa, base.llvm.mlir), each binary's PTX is assembled here into the --format the pipeline would have made (ptxas, then
    fatbinary for fatbin, with gpu-module-to-binary's arguments: NVPTXSerializer in mlir/lib/Target/LLVM/NVVM),
    written back into base.llvm.mlir, and translated. The PTX kept as the fallback is then the very PTX ptxas
    assembled, and the input is lowered once instead of once a format (the lowering, not ptxas, is most of the
    time: gpu-cases for sm_90 took 134.5 CPU s before, 89.9 after, the same bytes out:
    bench/results/test-time-2026-11-30-san.md). Returns {`SYMBOL_binary`: PTX bytes}; aot-manifest.mlir checks
    that the binaries equal the pipeline's own format=fatbin ones."""
    lower(args, "isa", base, translate=False)
    with open(base + ".llvm.mlir", encoding="latin-1") as f:
        text = f.read()
    ptx = {}
    with tempfile.TemporaryDirectory(prefix="moe-aot-") as tmp:
        def assemble(m):
            symbol, target, literal = m.groups()
            if re.search(r"\b(flags|link)\s*=", target):
                sys.exit(f"moe-aot: {symbol}: cannot assemble for {target} (ptxas flags or libraries)")
            chip = re.search(r'chip = "([^"]+)"', target).group(1)
            level = re.search(r"\bO = (\d+)", target)
            text_ptx = mlir_string_bytes(literal).rstrip(b"\0")
            ptx[f"{symbol}_binary"] = text_ptx
            stem = os.path.join(tmp, symbol)
            with open(stem + ".ptx", "wb") as f:
                f.write(text_ptx)
            # NVVMTargetAttr's default O is 2 (printed only when it differs).
            run([os.path.join(args.toolkit, "bin", "ptxas"), "-arch", chip, stem + ".ptx", "-o", stem + ".cubin",
                 "--opt-level", level.group(1) if level else "2"])
            out = stem + ".cubin"
            if args.format == "fatbin":
                sm = chip[len("sm_"):] if chip.startswith("sm_") else chip
                out = stem + ".fatbin"
                run([os.path.join(args.toolkit, "bin", "fatbinary"), "-64",
                     f"--image3=kind=elf,sm={sm},file={stem}.cubin", f"--image3=kind=ptx,sm={sm},file={stem}.ptx",
                     "--create", out])
            with open(out, "rb") as f:
                blob = f.read()
            return (f"gpu.binary @{symbol}  [#gpu.object<{target}, {args.format} = "
                    f'"{"".join(MLIR_STRING_BYTE[b] for b in blob)}">]')
        text, count = ISA_BINARY_RE.subn(assemble, text)
    if count != text.count("gpu.binary @"):
        sys.exit(f"moe-aot: {count} of the {text.count('gpu.binary @')} gpu.binary ops of the format=isa "
                 "lowering have one PTX object")
    with open(base + ".llvm.mlir", "w", encoding="latin-1") as f:
        f.write(text)
    translate_to_llvmir(args, base)
    return ptx


def write_ptx_fallback(args, name, binaries, ptx):
    """NAME-ptx/moe-<key>.ptx for every embedded binary (`ptx`: its PTX); returns module records."""
    folder = os.path.join(args.out_dir, f"{name}-ptx")
    os.makedirs(folder, exist_ok=True)
    modules = []
    for symbol, blob in sorted(binaries.items()):
        if symbol not in ptx:
            sys.exit(f"moe-aot: no PTX for {symbol} in the format=isa lowering")
        text = ptx[symbol].rstrip(b"\0")
        key = f"{fnv1a64(blob):016x}"
        path = os.path.join(folder, f"moe-{key}.ptx")
        with open(path, "wb") as f:
            f.write(text)
        version = re.search(rb"^\.version\s+([0-9.]+)", text, re.M)
        target = re.search(rb"^\.target\s+(\S+)", text, re.M)
        isa_version = version.group(1).decode() if version else None
        modules.append({"symbol": symbol, "blob_bytes": len(blob), "fnv1a64": key,
                        "ptx_file": os.path.relpath(path, args.out_dir),
                        "ptx_isa": isa_version, "ptx_target": target.group(1).decode() if target else None,
                        "ptx_needs_cuda": PTX_ISA_CUDA.get(isa_version)})
    return modules


def write_manifest(args, name, base, binaries, modules):
    toolkit = {t: tool_version(os.path.join(args.toolkit, "bin", t))
               for t in ("ptxas", "fatbinary", "nvcc")}
    major_minor = ".".join((toolkit.get("ptxas") or "").split(".")[:2]) or None
    files = sorted(f for f in os.listdir(args.out_dir)
                   if f.startswith(name) and os.path.isfile(os.path.join(args.out_dir, f))
                   and not f.endswith(".manifest.json"))
    files += sorted(os.path.join(f"{name}-ptx", f) for f in
                    os.listdir(os.path.join(args.out_dir, f"{name}-ptx"))) if modules else []
    manifest = {
        "name": name, "input": os.path.basename(args.input),
        "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "chip": args.chip, "format": args.format, "features": args.features or "+ptx80",
        # the options added to the pipeline (kernel variants such as flash-mma-block-rows=64): the GPU harness
        # records them with its results (which kernels its cases ran on), gpu_check.py picks its sanitizer cases
        "pipeline_options": args.pipeline_options,
        "toolkit": dict(toolkit, path=args.toolkit),
        # The cubin of a toolkit runs on drivers of the same CUDA major release and later;
        # the PTX fallback on any driver that reads its ISA.
        "binary_needs_cuda": major_minor,
        "binaries": [{"symbol": s, "bytes": len(b), "fnv1a64": f"{fnv1a64(b):016x}",
                      "fatbin": fatbin_entries(b)} for s, b in sorted(binaries.items())],
        "ptx_fallback": modules,
        "files": {f: sha256(os.path.join(args.out_dir, f)) for f in files},
    }
    path = base + ".manifest.json"
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
    return path


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input")
    ap.add_argument("-o", "--out-dir", required=True)
    ap.add_argument("--name")
    ap.add_argument("--chip", default="sm_90")
    ap.add_argument("--features", default="")
    ap.add_argument("--pipeline-options", default="",
                    help="more moe-lower-to-nvvm options, e.g. 'topk-rounds=redux'")
    ap.add_argument("--canonicalize", action="store_true",
                    help="run --canonicalize before the pipeline (the torch ops' kernel modules)")
    ap.add_argument("--format", default="fatbin", choices=["isa", "bin", "fatbin"])
    ap.add_argument("--toolkit", default="/usr/local/cuda")
    ap.add_argument("--moe-opt", default=os.path.join(here, "..", "..", "build", "bin", "moe-opt"))
    ap.add_argument("--llvm-bin", default="/usr/lib/llvm-22/bin")
    ap.add_argument("--link", action="store_true", help="also link libNAME.so")
    ap.add_argument("--runtime-dir", help="directory of libmoe_cuda_runtime.so (with --link)")
    ap.add_argument("--cxx", default=shutil.which("c++") or "g++")
    ap.add_argument("--ptx-fallback", action="store_true",
                    help="also write NAME-ptx/ (the PTX the runtime JITs when the binary is rejected)")
    ap.add_argument("--drop-intermediates", action="store_true",
                    help="remove NAME.llvm.mlir and NAME.ll after the build (a folder to carry)")
    args = ap.parse_args()

    name = args.name or os.path.splitext(os.path.basename(args.input))[0]
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, name)
    if args.ptx_fallback and args.format != "isa":
        ptx = assemble_isa_binaries(args, base)
    else:
        lower(args, args.format, base)
    run([os.path.join(args.llvm_bin, "llc"), "-O2", "-filetype=obj", "-relocation-model=pic",
         base + ".ll", "-o", base + ".o"])
    with open(base + ".ll") as f:
        binaries = llvm_binaries(f.read())
    if args.ptx_fallback and args.format == "isa":
        ptx = binaries  # the embedded binaries are the PTX (NUL-terminated)
    modules = write_ptx_fallback(args, name, binaries, ptx) if args.ptx_fallback else []
    if args.link:
        if not args.runtime_dir:
            sys.exit("moe-aot: --link needs --runtime-dir")
        run([args.cxx, "-shared", "-o", os.path.join(args.out_dir, f"lib{name}.so"), base + ".o",
             "-L" + args.runtime_dir, "-lmoe_cuda_runtime",
             "-Wl,-rpath," + os.path.abspath(args.runtime_dir)])
    if args.drop_intermediates:
        for ext in (".llvm.mlir", ".ll"):
            os.remove(base + ext)
    print(write_manifest(args, name, base, binaries, modules), file=sys.stderr)
    print(base + ".o")


if __name__ == "__main__":
    main()
