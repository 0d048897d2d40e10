#!/usr/bin/env python3
"""Assembles every kernel of the moe GPU lowering with `ptxas -v` and reports
registers, shared memory, stack and spills per kernel and chip.

  ptxas_report.py --moe-opt build/bin/moe-opt --ptxas /usr/local/cuda/bin/ptxas \
      --chips sm_80,sm_90 --out build/.../ptxas-report.md CASES.mlir...

Each function of the case files is lowered with moe-lower-to-nvvm (format=isa:
the PTX stays readable in the gpu.binary), the PTX is extracted and assembled
for the chip. Kernels launched from a function whose name starts with
`nospill_` must use no local memory: no spill stores or loads and a zero stack
frame; the script exits 1 (after writing the report) when one does, or when a
step fails. Runs without a GPU.

  --split-input-file  splits each file at `// -----` lines like moe-opt and
                      lowers every chunk on its own (chunks that expect a
                      diagnostic are skipped): the sweep over the lowering
                      tests' inputs,
  --all-nospill       holds every kernel, not only the nospill_* ones, to no
                      local memory,
  --lower-chip CHIP   lowers each case once, for CHIP, and assembles that
                      PTX for every chip of --chips (each at least CHIP:
                      ptxas takes sm_80 PTX for sm_90), instead of lowering
                      it again per chip. Our passes do the same for sm_80
                      and sm_90 (the chip only resolves topk-rounds, to
                      list-redux on both); LLVM's NVPTX back end differs in
                      a few bf16 instructions (sm_90 has native bf16
                      compares and arithmetic: ~0.1% of gpu-cases' PTX
                      lines). The lowering is two thirds of a sweep's time;
                      the lit sweeps use it, the published reports do not.

ptxas runs through bench/gpu/ptxas_cache.py where $MOE_PTXAS_CACHE names a
folder (test/lit.cfg.py sets one): PTX assembled before for the same chip and
flags by the same ptxas is not assembled again (its report, a failure too,
comes from the cache).

A case file may name moe-lower-to-nvvm options its ops need (kernels behind an
off-by-default option) on a line `// ptxas-options: OPTIONS`; they are added
to --pipeline-options for every chunk of that file.

The sweep over every GPU test input (what issue #10 asks: no kernel spills):

  ptxas_report.py --moe-opt build/bin/moe-opt --out /tmp/sweep.md \
      --split-input-file --all-nospill \
      test/Conversion/MoEToGPU/*.mlir test/GPU/Inputs/*.mlir
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import ptxas_cache


def decode_mlir_string(s):
    """Undoes MLIR's string-attribute escapes (\\XX hex, \\\\ and \\")."""
    out = bytearray()
    i = 0
    hexdigits = "0123456789abcdefABCDEF"
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if i + 2 < len(s) and n in hexdigits and s[i + 2] in hexdigits:
                out.append(int(s[i + 1:i + 3], 16))
                i += 3
                continue
            out += {"n": b"\n", "t": b"\t", '"': b'"', "\\": b"\\"}.get(n, n.encode())
            i += 2
            continue
        out += c.encode()
        i += 1
    return out.decode("utf-8", errors="replace")


def extract_ptx(lowered):
    """The PTX of every gpu.binary object (format=isa)."""
    ptx = []
    for m in re.finditer(r'assembly = "((?:[^"\\]|\\.)*)"', lowered):
        ptx.append(decode_mlir_string(m.group(1)))
    return ptx


def launches_by_function(lowered):
    """{host function: [kernel names it launches]} from the lowered module."""
    result = {}
    current = None
    for line in lowered.splitlines():
        m = re.match(r"\s*llvm\.func @([\w$.]+)\(", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"gpu\.launch_func\b.*?@\w+::@(\w+)", line)
        if m and current:
            result.setdefault(current, []).append(m.group(1))
    return result


def kernel_owners(lowered):
    """{kernel: the first host function launching it} of the lowered module."""
    owners = {}
    for fn, kernels in launches_by_function(lowered).items():
        for k in kernels:
            owners.setdefault(k, fn)
    return owners


def lower_to_isa(moe_opt, chip, options, text):
    """The finished moe-opt run lowering `text` with moe-lower-to-nvvm for
    `chip` (format=isa: the PTX stays readable in the gpu.binary) with the
    pipeline options `options`."""
    return subprocess.run(
        [moe_opt, "-", f"--moe-lower-to-nvvm=chip={chip} format=isa {options}".strip()],
        input=text, capture_output=True, text=True)


def tool_parser(doc, chips):
    """The command line of a tool that lowers cases with moe-opt and assembles
    their PTX with ptxas for the chips `chips` (this one and sass_budget.py),
    its docstring `doc` as the help."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moe-opt", required=True)
    ap.add_argument("--ptxas", default="/usr/local/cuda/bin/ptxas")
    ap.add_argument("--chips", default=chips, help="comma-separated chips")
    return ap


INFO_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
INFO_PROPS = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
INFO_USED = re.compile(r"Used (\d+) registers(.*)")


def parse_ptxas(report):
    kernels = {}
    current = None
    for line in report.splitlines():
        m = INFO_ENTRY.search(line)
        if m:
            current = m.group(1)
            kernels[current] = {"regs": 0, "smem": 0, "stack": 0, "spill_st": 0,
                                "spill_ld": 0, "lmem": 0, "cmem": 0}
            continue
        if current is None:
            continue
        m = INFO_PROPS.search(line)
        if m:
            kernels[current].update(stack=int(m.group(1)), spill_st=int(m.group(2)),
                                    spill_ld=int(m.group(3)))
            continue
        m = INFO_USED.search(line)
        if m:
            rest = m.group(2)
            kernels[current]["regs"] = int(m.group(1))
            for key, pat in (("smem", r"(\d+) bytes smem"), ("lmem", r"(\d+) bytes lmem"),
                             ("cmem", r"(\d+) bytes cmem\[0\]")):
                mm = re.search(pat, rest)
                if mm:
                    kernels[current][key] = int(mm.group(1))
    return kernels


def case_chunks(path, split):
    """[(name, text, options)] of a case file: the whole file, or with split
    its `// -----` chunks that expect no diagnostic, named file.N; options are
    those of the file's `// ptxas-options:` line (empty without one)."""
    name = os.path.splitext(os.path.basename(path))[0]
    with open(path) as f:
        text = f.read()
    marker = re.search(r"^// ptxas-options:(.*)$", text, flags=re.M)
    options = marker.group(1).strip() if marker else ""
    if not split:
        return [(name, text, options)]
    chunks = re.split(r"^// -----.*$", text, flags=re.M)
    return [(f"{name}.{n}" if len(chunks) > 1 else name, chunk, options)
            for n, chunk in enumerate(chunks) if "expected-" not in chunk]


def sm_number(chip):
    """80 for sm_80, 90 for sm_90 and sm_90a."""
    m = re.match(r"sm_(\d+)", chip)
    if not m:
        raise SystemExit(f"not a chip: {chip}")
    return int(m.group(1))


def assemble(args, name, path, chip, owners, rows, failures):
    """ptxas -v of case `name`'s PTX file `path` for `chip`: one row a kernel into
    `rows`, a failure into `failures` for a failed ptxas or local memory where
    none is allowed."""
    # (through the ptxas cache where the lit tests turn it on: the same PTX assembled by several of them)
    rep = ptxas_cache.run_ptxas(args.ptxas, ["-v", f"-arch={chip}", "-O3"], path)
    if rep.returncode != 0:
        failures.append(f"{path} ({chip}): ptxas failed:\n{rep.stderr}")
        return
    for kernel, info in parse_ptxas(rep.stderr + rep.stdout).items():
        fn = owners.get(kernel, "?")
        rows.append((chip, name, fn, kernel, info))
        local = info["spill_st"] + info["spill_ld"] + info["stack"] + info["lmem"]
        if (args.all_nospill or fn.startswith("nospill_")) and local > 0:
            failures.append(
                f"{chip} {fn}/{kernel}: local memory "
                f"(stack {info['stack']} B, spill stores {info['spill_st']} B, "
                f"spill loads {info['spill_ld']} B, lmem {info['lmem']} B)")


def main():
    ap = tool_parser(__doc__, chips="sm_80,sm_90")
    ap.add_argument("--out", required=True, help="markdown report to write")
    ap.add_argument("--keep-ptx", help="directory to keep the PTX files in")
    ap.add_argument("--pipeline-options", default="",
                    help="more moe-lower-to-nvvm options (e.g. flash-mma-block-rows=64: the 64-row tensor-core kernel)")
    ap.add_argument("--split-input-file", action="store_true",
                    help="lower each `// -----` chunk of a file on its own")
    ap.add_argument("--all-nospill", action="store_true",
                    help="every kernel must use no local memory")
    ap.add_argument("--lower-chip",
                    help="lower once for this chip and assemble its PTX for every --chips")
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args()
    chips = args.chips.split(",")
    if args.lower_chip and any(sm_number(c) < sm_number(args.lower_chip) for c in chips):
        ap.error(f"--lower-chip {args.lower_chip}: every chip of --chips must be at least it "
                 "(ptxas assembles PTX only for its own target or a later one)")

    rows = []
    failures = []
    tmp = args.keep_ptx or tempfile.mkdtemp(prefix="moe-ptxas-")
    os.makedirs(tmp, exist_ok=True)
    # (lowering chip, assembling chips): one lowering for all with --lower-chip, else one per chip.
    plan = [(args.lower_chip, chips)] if args.lower_chip else [(c, [c]) for c in chips]
    for lower_chip, targets in plan:
        for case, (name, text, file_options) in ((c, chunk) for c in args.cases
                                                 for chunk in case_chunks(c, args.split_input_file)):
            options = f"{args.pipeline_options} {file_options}".strip()
            proc = lower_to_isa(args.moe_opt, lower_chip, options, text)
            if proc.returncode != 0:
                failures.append(f"{name} ({lower_chip}): moe-opt failed:\n{proc.stderr}")
                continue
            lowered = proc.stdout
            owners = kernel_owners(lowered)
            for n, ptx in enumerate(extract_ptx(lowered)):
                path = os.path.join(tmp, f"{name}.{lower_chip}.{n}.ptx")
                with open(path, "w") as f:
                    f.write(ptx)
                for chip in targets:
                    assemble(args, name, path, chip, owners, rows, failures)

    with open(args.out, "w") as f:
        f.write("# ptxas report of the moe GPU kernels\n\n")
        f.write("Generated by bench/gpu/ptxas_report.py (`ptxas -v -O3`, PTX from "
                "`moe-opt --moe-lower-to-nvvm=\"chip=... format=isa\"`). "
                "`nospill_*` functions must not use local memory.\n\n")
        f.write("| chip | host function | kernel | registers | smem (B) | stack (B) "
                "| spill st (B) | spill ld (B) |\n|---|---|---|---:|---:|---:|---:|---:|\n")
        for chip, name, fn, kernel, i in rows:
            f.write(f"| {chip} | {fn} | {kernel} | {i['regs']} | {i['smem']} | "
                    f"{i['stack']} | {i['spill_st']} | {i['spill_ld']} |\n")
        if failures:
            f.write("\n## Failures\n\n")
            for msg in failures:
                f.write(f"- {msg}\n")
    print(f"ptxas report: {len(rows)} kernels, {len(failures)} failures -> {args.out}")
    for msg in failures:
        print("FAIL:", msg, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
