#!/usr/bin/env python3
"""The static SASS budget of the moe GPU kernels (issue #46, item 2): what each
kernel of a set of representative cases costs, read from its SASS, held to a
committed ceiling. Runs without a GPU.

  sass_budget.py --moe-opt build/bin/moe-opt --nvdisasm NVDISASM \
      --budgets bench/gpu/sass_budgets.json --chips sm_90 \
      --out bench/results/sass-budget-sm_90.md test/GPU/Inputs/sass-budget-cases.mlir

Each function of the case file is lowered with moe-lower-to-nvvm (format=isa),
its PTX assembled by ptxas (-O3, the chip) into a cubin and the cubin
disassembled by nvdisasm (PyPI: nvidia-cuda-nvdisasm). ptxas_report.py's
helpers lower the cases, extract the PTX, map kernels to the functions that
launch them and read ptxas -v. Per kernel, from the SASS:

  registers, spills    ptxas -v (spill stores + loads + stack + lmem, bytes);
  occupancy            resident blocks and warps per SM from the registers (256-
                       register allocation units per warp), the block's shared
                       memory (ptxas's static smem, plus the launch's constant
                       dynamic_shared_memory_size, plus 1 KiB the driver
                       reserves per block) and the block size (.reqntid or
                       .maxntid of the PTX entry), under the chip's limits
                       (64 warps, 32 blocks, 64 Ki registers; 228 KiB shared
                       memory on sm_90, 164 KiB on sm_80);
  global loads         LDG instructions by width (LDG.E: 32 bits, .64, .128,
                       .U16/.S16: 16, .U8/.S8: 8) and the widest;
  SHFL, REDUX, MUFU    instructions of each class (SHFL.*, REDUX.*, MUFU.*);
  hot loop             the selection loop: a loop is the span from a backward
                       branch's target to the branch (any BRA whose target
                       address is at or before its own, the end-of-kernel
                       self-branch excepted); the selection loop is the smallest
                       such span holding a cross-lane reduction (SHFL or
                       REDUX): each top-k round's butterfly or redux. Its body
                       is every instruction in the span, NOPs excepted: one
                       round's instructions per lane, counted statically
                       (conditional blocks inside count as executed);
  instr/elem/round     the body divided by the elements a lane holds in a
                       round (the case's `elements-per-lane`): SASS
                       instructions one lane issues per element per selection
                       round, the issue's "at most 2". Where ptxas unrolled
                       the rounds (no selection loop; the `loop` column then
                       reads "-"), a round is the span from the first SHFL or
                       REDUX to the last divided by rounds - 1 (an estimate
                       from above by a part of one round);
  per token            dynamic warp instructions per token: every
                       instruction outside the selection loop once, those
                       inside it `loop-trips` times (without one on the
                       line: the rounds less those ptxas peeled off before
                       the loop, counted by their SHFL/REDUX), those of a loop
                       around it (outside it) `outer-trips` times (default 1;
                       a refill only some warps make), divided by
                       `tokens-per-warp` (the case's `// sass-budget:` line;
                       other loops count once, so this is an estimate from
                       below where a kernel has other loops). SHFL, REDUX and
                       MUFU per token are read the same way.

Only functions with a `// sass-budget:` line get the per-element and
per-token figures (the selection kernels); the others' counts are static,
per kernel. A line's `chips=sm_90a` (comma-separated) measures the function
on those chips only; one without `chips` is measured on every chip of --chips
but the architecture-specific ones (sm_90a: its cases are those of its own
instructions, wgmma).

Budgets (--budgets, JSON) hold per chip and kernel the committed figures
("ceilings": the test fails when a kernel gets worse: more instructions per
element per round or per token, more SHFL/REDUX/MUFU per token, narrower
widest load, fewer warps per SM, any spill) and the issue's targets, printed
beside each figure with the gap. The script exits 1 when a kernel leaves its
budget, has no budget entry, or a step fails. --update rewrites the ceilings
to the current figures (what a change that moves a kernel commits, saying why).

The predicted time (issue 81): for sm_90 selection kernels with `tokens=` on their line, the time
bench/gpu/perf_model.py predicts from these figures at the H200's (predicted_us; route kernels also at 64
tokens, predicted_us_t64) is a ceiling too, with PREDICTED_TOLERANCE of slack, printed beside issue 81's
targets.

The calibration section (--calibrate RESULTS.md, the GPU benchmark's table):
for cases with `bench=NAME tokens=T`, the static issue-time estimate
(warp instructions per token x T / (SMs x 4 schedulers x clock)) and the HBM
floor (the function's argument and result bytes / the run's measured copy
bandwidth) beside the measured kernel time.
"""

import json
import math
import hashlib
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ptxas_report as pr  # noqa: E402

# Per-SM limits (CUDA occupancy calculator): warps, blocks, registers, shared
# memory an SM can give its blocks (the largest carveout), and what the
# driver reserves per block.
CHIPS = {
    "sm_80": dict(warps=64, blocks=32, regs=65536, smem=167936, reserved=1024),
    "sm_90": dict(warps=64, blocks=32, regs=65536, smem=233472, reserved=1024),
    "sm_90a": dict(warps=64, blocks=32, regs=65536, smem=233472, reserved=1024),
}
# Issue-rate model of the calibration (issue #46): 132 SMs x 4 schedulers,
# one warp instruction per scheduler and cycle at 1.755 GHz.
ISSUE_SMS, ISSUE_SCHEDULERS, ISSUE_GHZ = 132, 4, 1.755

INSTR = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
LABEL = re.compile(r"^(\.L_x_\d+|[\w$.]+):\s*$")
SECTION = re.compile(r"^\s*\.section\s+\.text\.([\w$.]+),")
BRANCH_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def parse_sass(text):
    """{kernel: [(address, predicate, opcode, operands)]} and {kernel: {label:
    address}} of nvdisasm's listing."""
    kernels, labels = {}, {}
    current = None
    pending = []
    for line in text.splitlines():
        m = SECTION.match(line)
        if m:
            current = m.group(1)
            kernels[current], labels[current] = [], {}
            pending = []
            continue
        if current is None:
            continue
        m = LABEL.match(line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = INSTR.match(line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        for lab in pending:
            labels[current][lab] = addr
        pending = []
        body = m.group(2).strip()
        pred = ""
        if body.startswith("@"):
            pred, body = body.split(None, 1)
        parts = body.split(None, 1)
        kernels[current].append((addr, pred, parts[0], parts[1] if len(parts) > 1 else ""))
    for k, pend in ((current, pending),) if current else ():
        for lab in pend:  # labels after the last instruction (the end)
            labels[k][lab] = kernels[k][-1][0] + 16 if kernels[k] else 0
    return kernels, labels


def loops_of(insts, labels):
    """[(start, end)] address spans of backward branches (end = the branch)."""
    spans = []
    for addr, _pred, op, operands in insts:
        if not op.startswith("BRA"):
            continue
        m = BRANCH_TARGET.search(operands)
        if not m or m.group(1) not in labels:
            continue
        target = labels[m.group(1)]
        if target < addr:
            spans.append((target, addr))
    return spans


def load_bits(op):
    """Width in bits of an LDG opcode (LDG.E.128 -> 128, LDG.E.U16 -> 16)."""
    width = 32
    for part in op.split(".")[1:]:
        if part in ("64", "128"):
            width = int(part)
        elif part in ("U16", "S16"):
            width = 16
        elif part in ("U8", "S8"):
            width = 8
    return width


def is_class(op, cls):
    return op == cls or op.startswith(cls + ".")


def kernel_figures(insts, labels, note):
    """The SASS figures of one kernel; `note` is its `// sass-budget:` line
    (a dict, possibly empty)."""
    body = [i for i in insts if i[2] != "NOP"]
    spans = loops_of(body, labels)
    sel = [s for s in spans
           if any(s[0] <= a <= s[1] and (is_class(op, "SHFL") or is_class(op, "REDUX"))
                  for a, _p, op, _o in body)]
    hot = min(sel, key=lambda s: s[1] - s[0]) if sel else None
    inside = (lambda a: hot[0] <= a <= hot[1]) if hot else (lambda a: False)
    loads = {}
    for _a, _p, op, _o in body:
        if is_class(op, "LDG"):
            w = load_bits(op)
            loads[w] = loads.get(w, 0) + 1
    fig = {
        "instructions": len(body),
        "loops": len(spans),
        "loads": loads,
        "widest_load_bits": max(loads) if loads else None,
        "shfl": sum(is_class(op, "SHFL") for _a, _p, op, _o in body),
        "redux": sum(is_class(op, "REDUX") for _a, _p, op, _o in body),
        "mufu": sum(is_class(op, "MUFU") for _a, _p, op, _o in body),
        "hot_loop": sum(inside(a) for a, _p, _op, _o in body) if hot else None,
    }
    if hot:
        fig["hot_loop_span"] = [hot[0], hot[1]]
    if note and "scores-per-tile" in note:
        # The flash kernel (tensor cores); a function's other kernels (a
        # key split's combine kernel) get the per-kernel figures only.
        if any(is_class(op, "HMMA") for _a, _p, op, _o in body):
            fig.update(flash_figures(body, spans, note))
        return fig
    if note:
        epl = note["elements-per-lane"]
        tpw = note.get("tokens-per-warp", 1)
        trips = note.get("loop-trips")
        if trips is None:
            # The rounds the loop runs: k less the rounds ptxas peeled off
            # before it, each with as many cross-lane reductions as the loop's
            # body (kernels whose only SHFL/REDUX are the rounds' own).
            red_in = sum(1 for a, _p, op, _o in body
                         if inside(a) and (is_class(op, "SHFL") or is_class(op, "REDUX")))
            red_out = sum(1 for a, _p, op, _o in body
                          if not inside(a) and (is_class(op, "SHFL") or is_class(op, "REDUX")))
            trips = note.get("rounds", 0) - round(red_out / red_in) if red_in else 0
        fig["loop_trips"] = trips
        if hot is None and trips:
            raise ValueError("no selection loop (a loop holding SHFL/REDUX) in the SASS, but the case's "
                             "`// sass-budget:` line says loop-trips="
                             f"{trips}: update the line to the kernel's mapping")

        # A loop around the selection loop whose code outside it runs only
        # now and then (a refill): `outer-trips` times per warp, not once.
        outer = [sp for sp in spans if hot and sp != hot and sp[0] <= hot[0] and hot[1] <= sp[1]]
        outer = min(outer, key=lambda sp: sp[1] - sp[0]) if outer else None
        outer_trips = note.get("outer-trips", 1)

        def weight(a):
            if inside(a):
                return trips
            if outer and outer[0] <= a <= outer[1]:
                return outer_trips
            return 1

        def per_token(pred):
            return round(sum(weight(a) for a, _p, op, _o in body if pred(op)) / tpw, 2)

        rounds = note.get("rounds", 0)
        red = [n for n, (_a, _p, op, _o) in enumerate(body) if is_class(op, "SHFL") or is_class(op, "REDUX")]
        if hot:
            fig["instr_per_elem_round"] = round(fig["hot_loop"] / epl, 2)
        elif rounds > 1 and red:
            # Rounds unrolled (no loop): the span from the first cross-lane
            # reduction to the last is rounds - 1 rounds and a part of one.
            fig["unrolled_round"] = round((red[-1] - red[0] + 1) / (rounds - 1), 2)
            fig["instr_per_elem_round"] = round(fig["unrolled_round"] / epl, 2)
        else:
            fig["instr_per_elem_round"] = None
        fig["instr_per_token"] = per_token(lambda op: True)
        fig["shfl_per_token"] = per_token(lambda op: is_class(op, "SHFL"))
        fig["redux_per_token"] = per_token(lambda op: is_class(op, "REDUX"))
        fig["mufu_per_token"] = per_token(lambda op: is_class(op, "MUFU"))
    return fig


# The instruction classes of a flash kernel's key loop, per score.
SCORE_CLASSES = ("HMMA", "LDSM", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "F2FP", "SHFL", "FSEL", "LDG",
                 "LDGSTS", "STS", "BAR")


def flash_figures(body, spans, note):
    """The key loop of a flash mixing kernel (a `// sass-budget:` line with
    scores-per-tile=N, the scores a thread computes in one trip of it): the
    smallest innermost loop holding an HMMA (one with no other such loop
    inside; the peeled loop of whole tiles, before the checked last/diagonal
    ones; with the lazy rescale of the 128-row kernel the hot loop of whole
    tiles inside the loop of the exact steps). The figure is its body
    outside the loops nested in it, divided by scores-per-tile: the nested
    loops are the staging loops (element by element, or 16 bytes a trip;
    the misaligned operands' fallback), whose instructions are reported
    beside it and not counted (their cost per score depends on their trips);
    staging unrolled into the body (constant trips) is counted. Conditional
    blocks count as executed. A loop holding HMMA around the key loop (the
    lazy rescale's exact step, taken in a tile where a row max grew past
    the margin) is reported beside it as `around`: its instructions outside
    the key loop, run once a trip of that loop, not every tile."""
    spt = note["scores-per-tile"]
    mma = [s for s in spans
           if any(s[0] <= a <= s[1] and is_class(op, "HMMA") for a, _p, op, _o in body)]
    inner = [s for s in mma if not any(t != s and s[0] <= t[0] and t[1] <= s[1] for t in mma)]
    if not inner:
        raise ValueError("no key loop (a loop holding HMMA) in the SASS, but the case's "
                         "`// sass-budget:` line says scores-per-tile: update the line")
    key = min(inner, key=lambda s: s[1] - s[0])
    nested = [s for s in spans if s != key and key[0] <= s[0] and s[1] <= key[1]]
    in_nested = lambda a: any(s[0] <= a <= s[1] for s in nested)  # noqa: E731
    inside = [op for a, _p, op, _o in body if key[0] <= a <= key[1] and not in_nested(a)]
    staged = sum(1 for a, _p, _op, _o in body if key[0] <= a <= key[1] and in_nested(a))
    around = [s for s in mma if s != key and s[0] <= key[0] and key[1] <= s[1]]
    around = min(around, key=lambda s: s[1] - s[0]) if around else None
    around_instr = (sum(1 for a, _p, _op, _o in body if around[0] <= a <= around[1]
                        and not key[0] <= a <= key[1]) if around else 0)
    per_class = {c: round(sum(is_class(op, c) for op in inside) / spt, 3) for c in SCORE_CLASSES}
    return {"key_loop": len(inside), "key_loop_span": [key[0], key[1]], "key_loop_nested": len(nested),
            "key_loop_nested_instr": staged, "key_loop_around_instr": around_instr,
            "instr_per_score": round(len(inside) / spt, 2), "per_score": per_class}


def occupancy(chip, regs, smem, threads):
    """(blocks, warps) resident per SM."""
    lim = CHIPS[chip]
    warps_per_block = math.ceil(threads / 32)
    regs_per_warp = math.ceil(max(regs, 1) * 32 / 256) * 256
    by_regs = (lim["regs"] // regs_per_warp) // warps_per_block
    by_smem = lim["smem"] // (smem + lim["reserved"])
    by_warps = lim["warps"] // warps_per_block
    blocks = min(by_regs, by_smem, by_warps, lim["blocks"])
    return blocks, blocks * warps_per_block


def block_sizes(ptx):
    """{kernel: threads per block} from the PTX entries' .reqntid/.maxntid."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)\s*\((?:[^)]*)\)\s*((?:\.(?:reqntid|maxntid|minnctapersm|maxnreg)"
                         r"[^\n{]*\s*)*)", ptx):
        dims = re.search(r"\.(?:reqntid|maxntid)\s+([\d,\s]+)", m.group(2))
        if dims:
            n = 1
            for d in dims.group(1).replace(",", " ").split():
                n *= int(d)
            out[m.group(1)] = n
    return out


NOTE = re.compile(r"^// sass-budget:(.*)\n(?://.*\n)*func\.func @(\w+)", re.M)


def budget_notes(text):
    """{function: {key: value}} of the case file's `// sass-budget:` lines."""
    notes = {}
    for m in NOTE.finditer(text):
        d = {}
        for item in m.group(1).split():
            k, v = item.split("=", 1)
            if k == "options":  # moe-lower-to-nvvm options, comma-separated
                v = " ".join(v.split(","))
            if k == "chips":  # the chips to measure it on, comma-separated
                v = v.split(",")
            d[k] = v if k in ("kernel", "bench", "options", "predicts", "chips") else float(v) if "." in v else int(v)
        notes[m.group(2)] = d
    return notes


TYPE = re.compile(r"tensor<([\dx]+)x(f32|f16|bf16|i32|i64|i1)>")
BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "i1": 1}


def function_bytes(text):
    """{function: bytes of its static arguments and results} (the HBM floor's
    traffic: each read once, each written once)."""
    out = {}
    for m in re.finditer(r"func\.func @(\w+)\((.*?)\)\s*->\s*(\(.*?\)|[^{]+)\s*\{", text):
        total = 0
        for t in TYPE.finditer(m.group(2) + " " + m.group(3)):
            n = 1
            for d in t.group(1).split("x"):
                n *= int(d)
            total += n * BYTES[t.group(2)]
        out[m.group(1)] = total
    return out


def base_name(kernel):
    return re.sub(r"_\d+$", "", kernel)


# (figure, direction, target) of the budget; direction "max": the figure must
# not rise above its ceiling, "min": not fall below its floor.
CHECKS = [
    ("instr_per_score", "max"),
    ("instr_per_elem_round", "max"),
    ("instr_per_token", "max"),
    ("shfl_per_token", "max"),
    ("redux_per_token", "max"),
    ("mufu_per_token", "max"),
    ("shfl", "max"),
    ("redux", "max"),
    ("mufu", "max"),
    ("widest_load_bits", "min"),
    ("warps_per_sm", "min"),
    ("spill_bytes", "max"),
    ("predicted_us", "max"),
    ("predicted_us_t64", "max"),
]
# The model's predicted time may rise this much over its committed figure before the budget fails (the
# prediction moves with every instruction; the ratchet is on the time, not a count).
PREDICTED_TOLERANCE = 0.05


def target_of(targets, key, fig, note):
    """The issue's target for one figure of a kernel, or None."""
    if key.startswith("predicted") and key not in fig:
        return None
    if key == "predicted_us" and note.get("kernel", "").startswith("topk"):
        return round(perf_model().topk_target_us(fig["bytes"]), 2)
    if key == "predicted_us_t64":
        return perf_model().TARGETS["route_t64_us"]
    if key == "spill_bytes":
        return targets["spill_bytes"]
    if not note:
        return None
    if key == "instr_per_elem_round":
        return targets["instr_per_elem_round"]
    if key == "instr_per_score":
        return targets["flash_instr_per_score"]
    if key == "widest_load_bits" and "scores-per-tile" not in note:
        return targets["widest_load_bits"]
    if key == "shfl_per_token" and note.get("kernel", "").startswith("route") and note.get("experts") == 256:
        return targets["route_shfl_per_token_e256"]
    return None


def perf_model():
    """bench/gpu/perf_model.py (imported late: it imports this module)."""
    import perf_model as pm
    return pm


def add_predictions(rows, fbytes):
    """The model's predicted time (H200, us) of each sm_90 selection kernel at its case's tokens, and of the
    route kernels at 64 tokens (issue 81: the budget that counts is the predicted time against the targets)."""
    pm = perf_model()
    for chip, fn, _kernel, fig, note in rows:
        if chip != "sm_90" or not fig.get("instr_per_token") or "tokens" not in note:
            continue
        fig["bytes"] = fbytes.get(fn, 0)
        fig["predicted_us"] = round(pm.predicted_us(fig, note, note["tokens"], fig["bytes"]), 2)
        if note["kernel"].startswith("route"):
            fig["predicted_us_t64"] = round(pm.predicted_us(fig, note, 64, fig["bytes"] * 64 / note["tokens"]), 2)


def meets(direction, value, bound):
    return value <= bound if direction == "max" else value >= bound


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}".rstrip("0").rstrip(".") if v != int(v) else str(int(v))
    return str(v)


def parse_results(path):
    """(kernel us by case, measured copy GB/s, device line) of a GPU benchmark
    result file (bench/results/gpu-*.md)."""
    text = open(path).read()
    copy = re.search(r"measured copy (\d+(?:\.\d+)?) GB/s", text)
    device = text.splitlines()[2] if len(text.splitlines()) > 2 else ""
    times = {}
    header = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None if not line.strip() else header
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "case":
            header = cells
            continue
        if header and "ours kernel us" in header and len(cells) == len(header):
            try:
                times[cells[0]] = float(cells[header.index("ours kernel us")])
            except ValueError:
                pass
    return times, float(copy.group(1)) if copy else None, device


def options_groups(functions, notes, base=""):
    """{moe-lower-to-nvvm options: [functions]}: each function with the
    options of its `// sass-budget:` line (options=...) after `base`."""
    groups = {}
    for fn in sorted(functions):
        opts = f"{base} {notes.get(fn, {}).get('options', '')}".strip()
        groups.setdefault(opts, []).append(fn)
    return groups


def dynamic_shared_bytes(lowered):
    """{kernel: bytes of dynamic shared memory its launch passes} (a constant dynamic_shared_memory_size) of the
    lowered module's host code; kernels launched without one are absent."""
    result = {}
    for fn in re.split(r"\n\s*llvm\.func ", lowered):
        consts = dict(re.findall(r"(%\w+) = llvm\.mlir\.constant\((\d+) : i32\) : i32", fn))
        for kernel, value in re.findall(r"gpu\.launch_func\b.*?@\w+::@(\w+)\b.*?dynamic_shared_memory_size (%\w+)",
                                        fn):
            if value in consts:
                result[kernel] = max(result.get(kernel, 0), int(consts[value]))
    return result


def launch_grids(lowered):
    """{kernel: blocks of its launch} (the product of a gpu.launch_func's constant `blocks in` sizes) of the
    lowered module's host code; kernels whose grid is not a constant are absent."""
    result = {}
    for fn in re.split(r"\n\s*llvm\.func ", lowered):
        consts = dict(re.findall(r"(%\w+) = llvm\.mlir\.constant\((\d+) : (?:i32|i64|index)\) : i(?:32|64)", fn))
        for kernel, dims in re.findall(r"gpu\.launch_func\b.*?@\w+::@(\w+) blocks in \(([^)]*)\)", fn):
            sizes = [consts.get(d.strip()) for d in dims.split(",")]
            if all(sizes):
                result[kernel] = math.prod(int(n) for n in sizes)
    return result


def measure(args, chip, options, text, notes, tmp):
    """([(chip, function, kernel, figures, note)], [failures]) of the
    functions in `text` lowered for `chip` with `options`."""
    rows, failures = [], []
    # a short tag per option set (a long option list would pass the file system's name limit)
    tag = hashlib.sha1(options.encode()).hexdigest()[:12] + "." if options else ""
    proc = pr.lower_to_isa(args.moe_opt, chip, options, text)
    if proc.returncode != 0:
        return rows, [f"{chip} {options}: moe-opt failed:\n{proc.stderr}"]
    owners = pr.kernel_owners(proc.stdout)
    dynamic = dynamic_shared_bytes(proc.stdout)
    grids = launch_grids(proc.stdout)
    for n, ptx in enumerate(pr.extract_ptx(proc.stdout)):
        stem = os.path.join(tmp, f"{chip}.{tag}{n}")
        with open(stem + ".ptx", "w") as f:
            f.write(ptx)
        rep = subprocess.run([args.ptxas, "-v", f"-arch={chip}", "-O3", stem + ".ptx", "-o", stem + ".cubin"],
                             capture_output=True, text=True)
        if rep.returncode != 0:
            failures.append(f"{stem}.ptx: ptxas failed:\n{rep.stderr}")
            continue
        dis = subprocess.run([args.nvdisasm, "-c", stem + ".cubin"], capture_output=True, text=True)
        if dis.returncode != 0:
            failures.append(f"{stem}.cubin: nvdisasm failed:\n{dis.stderr}")
            continue
        with open(stem + ".sass", "w") as f:
            f.write(dis.stdout)
        sass, labels = parse_sass(dis.stdout)
        threads = block_sizes(ptx)
        for kernel, info in pr.parse_ptxas(rep.stderr + rep.stdout).items():
            fn = owners.get(kernel, "?")
            note = notes.get(fn, {})
            # A line without kernel= (only chips= or options=) asks for the per-kernel figures alone.
            if note and not ("kernel" in note and kernel.startswith(note["kernel"])):
                note = {}
            try:
                fig = kernel_figures(sass.get(kernel, []), labels.get(kernel, {}), note)
            except ValueError as e:
                failures.append(f"{chip} {fn}/{kernel}: {e}")
                continue
            # Static (ptxas) plus dynamic (the launch's) shared memory.
            smem = info["smem"] + dynamic.get(kernel, 0)
            blocks, warps = occupancy(chip, info["regs"], smem, threads.get(kernel, 128))
            fig.update(regs=info["regs"], smem=smem, threads=threads.get(kernel, 128),
                       blocks_per_sm=blocks, warps_per_sm=warps, grid_blocks=grids.get(kernel),
                       spill_bytes=info["spill_st"] + info["spill_ld"] + info["stack"] + info["lmem"])
            rows.append((chip, fn, kernel, fig, note))
    return rows, failures


def main():
    ap = pr.tool_parser(__doc__, chips="sm_90")
    ap.add_argument("--nvdisasm", default="nvdisasm")
    ap.add_argument("--budgets", required=True, help="JSON of ceilings and targets")
    ap.add_argument("--update", action="store_true",
                    help="write the current figures as the ceilings of --budgets")
    ap.add_argument("--out", required=True, help="markdown table to write")
    ap.add_argument("--calibrate", action="append", default=[],
                    help="a GPU benchmark result (bench/results/gpu-*.md) to compare the static figures with")
    ap.add_argument("--keep", help="directory to keep the PTX, cubins and SASS in")
    ap.add_argument("--functions", help="comma-separated functions of the case file to measure (default: all)")
    ap.add_argument("cases")
    args = ap.parse_args()

    text = open(args.cases).read()
    funcs = {m.group(1): m.group(0) for m in
             re.finditer(r"^func\.func @(\w+).*?^}\n", text, flags=re.M | re.S)}
    wanted = set(args.functions.split(",")) if args.functions else set(funcs)
    missing = wanted - set(funcs)
    if missing:
        print(f"error: no function {', '.join(sorted(missing))} in {args.cases}", file=sys.stderr)
        return 1
    notes = budget_notes(text)
    fbytes = function_bytes(text)
    budgets = json.load(open(args.budgets))
    targets = budgets["targets"]
    tmp = args.keep or tempfile.mkdtemp(prefix="moe-sass-")
    os.makedirs(tmp, exist_ok=True)

    rows, failures = [], []
    for chip in args.chips.split(","):
        # A case is measured on the chips its note names (chips=...), or without one on every chip but the
        # architecture-specific ones (sm_90a: the cases of its own instructions, wgmma).
        on_chip = {fn for fn in wanted
                   if chip in notes.get(fn, {}).get("chips", []) or
                   ("chips" not in notes.get(fn, {}) and not chip.endswith("a"))}
        for options, fns in options_groups(on_chip, notes).items():
            r, f = measure(args, chip, options, "".join(funcs[fn] for fn in fns), notes, tmp)
            rows += r
            failures += f
    calibrations = []
    for spec in args.calibrate:
        # PATH[:OPTIONS]: the run's kernels are the functions its table names
        # (bench=), lowered for sm_90 with the options its library was built
        # with (a run older than a default names the old default here).
        path, _, options = spec.partition(":")
        fns = [fn for fn in wanted if "bench" in notes.get(fn, {}) or "predicts" in notes.get(fn, {})]
        crows = []
        for opts, group in options_groups(fns, notes, base=options.replace(",", " ")).items():
            r, f = measure(args, "sm_90", opts, "".join(funcs[fn] for fn in group), notes, tmp)
            crows += r
            failures += f
        calibrations.append((path, options, crows))

    add_predictions(rows, fbytes)
    # The budget: each kernel against its committed figures.
    ceilings = budgets.setdefault("ceilings", {})
    verdicts = []  # (chip, fn, kernel, key, value, ceiling, target, ok)
    seen = {}
    for chip, fn, kernel, fig, note in rows:
        key = f"{fn}/{base_name(kernel)}"
        # A function launching two kernels of one name: the second is key#2
        # (per chip: every chip lowers the same functions).
        seen[chip, key] = seen.get((chip, key), 0) + 1
        if seen[chip, key] > 1:
            key += f"#{seen[chip, key]}"
        if args.update:
            ceilings.setdefault(chip, {})[key] = {
                k: fig[k] for k, _d in CHECKS if fig.get(k) is not None}
        entry = ceilings.get(chip, {}).get(key)
        if entry is None:
            failures.append(f"{chip} {key}: no budget in {args.budgets} (--update writes one)")
            continue
        for k, direction in CHECKS:
            value = fig.get(k)
            target = target_of(targets, k, fig, note)
            if value is None:
                continue
            bound = entry.get(k)
            slack = 1 + PREDICTED_TOLERANCE if k.startswith("predicted") else 1
            ok = bound is None or meets(direction, value, bound * slack)
            if k == "spill_bytes" and value > targets["spill_bytes"]:
                ok = False  # no spills is a hard budget, not a ratchet
            verdicts.append((chip, fn, kernel, k, value, bound, target, ok, direction))
            if not ok:
                failures.append(f"{chip} {key}: {k} = {fmt(value)}, budget "
                                f"{'<=' if direction == 'max' else '>='} {fmt(bound)}")
    if args.update:
        with open(args.budgets, "w") as f:
            json.dump(budgets, f, indent=1, sort_keys=True)
            f.write("\n")

    with open(args.out, "w") as f:
        write_report(f, args, rows, verdicts, failures, targets, fbytes, notes, calibrations)
    targets_met = sum(1 for v in verdicts if v[6] is not None and meets(v[8], v[4], v[6]))
    targets_all = sum(1 for v in verdicts if v[6] is not None)
    over = sum(1 for v in verdicts if not v[7])
    print(f"sass budget: {len(rows)} kernels, {over} over budget, {targets_met} of {targets_all} "
          f"targets met, {len(failures)} failures -> {args.out}")
    for chip, fn, kernel, fig, note in rows:
        print(f"{chip} {fn}/{kernel}: regs {fig['regs']} warps/SM {fig['warps_per_sm']} "
              f"loads {fmt(fig['widest_load_bits'])}b SHFL {fig['shfl']} REDUX {fig['redux']} "
              f"MUFU {fig['mufu']} loop {fmt(fig['hot_loop'])} "
              f"instr/elem/round {fmt(fig.get('instr_per_elem_round'))} "
              f"instr/token {fmt(fig.get('instr_per_token'))} "
              f"SHFL/token {fmt(fig.get('shfl_per_token'))}"
              + (f" instr/score {fmt(fig['instr_per_score'])} (key loop {fig['key_loop']}, "
                 f"{fig['key_loop_nested']} nested loops of {fig['key_loop_nested_instr']} not counted, "
                 f"{fig['key_loop_around_instr']} around it; per score "
                 + " ".join(f"{c} {fmt(v)}" for c, v in fig["per_score"].items() if v) + ")"
                 if "instr_per_score" in fig else ""))
    sys.stdout.flush()  # the summary before the failures, also through one pipe (2>&1)
    for msg in failures:
        print("FAIL:", msg, file=sys.stderr)
    return 1 if failures else 0


def write_report(f, args, rows, verdicts, failures, targets, fbytes, notes, calibrations):
    f.write("# Static SASS budget of the moe GPU kernels\n\n")
    f.write("Generated by bench/gpu/sass_budget.py from test/GPU/Inputs/sass-budget-cases.mlir "
            "(`moe-opt --moe-lower-to-nvvm=\"chip=... format=isa\"`, `ptxas -O3`, `nvdisasm -c`); the "
            "method is the script's docstring. Ceilings: bench/gpu/sass_budgets.json; the lit test "
            "test/GPU/sass-budget.mlir fails when a kernel leaves them.\n\n")
    f.write("## Per kernel\n\n")
    f.write("loads: LDG count by width in bits; loop: instructions in the selection loop's body; "
            "e/lane: elements a lane holds per round; per token: dynamic warp instructions (and SHFL, "
            "REDUX, MUFU) per token.\n\n")
    f.write("| chip | function | kernel | regs | smem (B) | threads | blocks/SM | warps/SM | spills (B) "
            "| loads | SHFL | REDUX | MUFU | instr | loop | e/lane | instr/elem/round | instr/token "
            "| SHFL/token | REDUX/token | MUFU/token |\n")
    f.write("|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for chip, fn, kernel, fig, note in rows:
        loads = " ".join(f"{w}b x{c}" for w, c in sorted(fig["loads"].items())) or "-"
        f.write(f"| {chip} | {fn} | {kernel} | {fig['regs']} | {fig['smem']} | {fig['threads']} | "
                f"{fig['blocks_per_sm']} | {fig['warps_per_sm']} | {fig['spill_bytes']} | {loads} | "
                f"{fig['shfl']} | {fig['redux']} | {fig['mufu']} | {fig['instructions']} | "
                f"{fmt(fig['hot_loop'])} | {fmt(note.get('elements-per-lane'))} | "
                f"{fmt(fig.get('instr_per_elem_round'))} | {fmt(fig.get('instr_per_token'))} | "
                f"{fmt(fig.get('shfl_per_token'))} | {fmt(fig.get('redux_per_token'))} | "
                f"{fmt(fig.get('mufu_per_token'))} |\n")
    flash = [(chip, fn, kernel, fig, note) for chip, fn, kernel, fig, note in rows if "instr_per_score" in fig]
    if flash:
        f.write("\n## Flash mixing kernels: the key loop per score\n\n")
        f.write("key loop: instructions in the body of the kernel's key loop (the peeled loop of whole "
                "tiles; with the lazy rescale its hot loop) outside the loops nested in it; "
                "nested: those loops (staging) and their instructions, not counted; around: the "
                "instructions of the loop around it outside it (the lazy rescale's exact step, run "
                "for a tile where a row max grew past the margin), not counted; scores/tile: the scores a "
                "thread computes in one trip (the case's scores-per-tile); instr/score: key loop / "
                "scores/tile; then each class's instructions per score. smem: static plus dynamic.\n\n")
        f.write("| chip | function | kernel | options | regs | smem (B) | warps/SM | spills (B) | key loop "
                "| nested | around | scores/tile | instr/score | " + " | ".join(SCORE_CLASSES) + " |\n")
        f.write("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(SCORE_CLASSES)
                + "\n")
        for chip, fn, kernel, fig, note in flash:
            f.write(f"| {chip} | {fn} | {kernel} | {note.get('options', '') or '-'} | {fig['regs']} | "
                    f"{fig['smem']} | {fig['warps_per_sm']} | {fig['spill_bytes']} | {fig['key_loop']} | "
                    f"{fig['key_loop_nested']} ({fig['key_loop_nested_instr']}) | {fig['key_loop_around_instr']} | "
                    f"{fmt(note['scores-per-tile'])} | "
                    f"{fmt(fig['instr_per_score'])} | "
                    + " | ".join(fmt(fig["per_score"][c]) for c in SCORE_CLASSES) + " |\n")
    f.write("\n## Against the budget and the issue's targets\n\n")
    f.write(f"Targets (issue #46): at most {targets['instr_per_elem_round']} instructions per element per "
            f"round in the top-k loop; route at most {targets['route_shfl_per_token_e256']} SHFL per token "
            f"at E = 256; logits loaded {targets['widest_load_bits']} bits wide; no spills. "
            f"Issue #47: at most {targets['flash_instr_per_score']} instructions per score in the flash "
            "kernels' key loop. "
            "Ceiling: the committed figure the test holds the kernel to (floor for load width and "
            "occupancy). gap: the figure over the target (x: how many times it).\n\n")
    f.write(plan_line(rows))
    f.write("| chip | function | kernel | figure | now | ceiling | target | gap | budget |\n")
    f.write("|---|---|---|---|---:|---:|---:|---:|---|\n")
    for chip, fn, kernel, k, value, bound, target, ok, direction in verdicts:
        if target is None and k not in ("instr_per_token", "shfl_per_token", "redux_per_token",
                                        "warps_per_sm", "predicted_us"):
            continue
        gap = "-"
        if target is not None:
            if meets(direction, value, target):
                gap = "met"
            elif direction == "max" and target:
                gap = f"{value / target:.1f}x"
            elif direction == "min" and value:
                gap = f"{target / value:.0f}x narrower"
        f.write(f"| {chip} | {fn} | {kernel} | {k} | {fmt(value)} | {fmt(bound)} | {fmt(target)} | "
                f"{gap} | {'ok' if ok else 'OVER'} |\n")
    for path, options, crows in calibrations:
        write_calibration(f, path, options, crows, fbytes, notes)
    write_variant_ranking(f, calibrations, fbytes)
    if failures:
        f.write("\n## Failures\n\n")
        for msg in failures:
            f.write(f"- {msg}\n")


def plan_line(rows):
    """Issue 81's model figures: what predicted_us is, and the route + plan chain against its target."""
    pm = perf_model()
    t = pm.TARGETS
    plan = [(k, fig) for chip, fn, k, fig, _n in rows if chip == "sm_90" and fn == "route_plan_deepseek_v3"]
    line = (f"Issue 81: predicted_us = the time bench/gpu/perf_model.py predicts from the SASS at the H200's figures "
            f"(copy {pm.H200_COPY_GBS:g} GB/s) at the case's tokens (predicted_us_t64: at 64 tokens), within "
            f"{PREDICTED_TOLERANCE:.0%} of its ceiling; targets: topk_renorm at {t['topk_copy_fraction']:.0%} of the "
            f"copy bandwidth (its bytes at that rate), route at 64 tokens within {t['route_t64_us']:g} us.")
    if plan:
        route = next((fig.get("predicted_us") for _k, fig in plan if fig.get("predicted_us")), None)
        line += (f" DeepSeek-V3 route + plan at T = 8192 (target {t['route_plan_us']:g} us in at most "
                 f"{t['plan_launches']} launches): {len(plan)} launches, its route kernel alone {fmt(route)} us "
                 "predicted (the plan's kernels loop: their time is not predicted here, see "
                 "bench/results/gpu-perf-model.md).")
    return line + "\n\n"


def calibration_points(path, rows, fbytes):
    """[(bench case, T, instr/token, issue us, MB, HBM us, bound us,
    measured us)] of one GPU run against the static figures of `rows`, and
    the run's (copy GB/s, device line)."""
    times, copy_gbs, device = parse_results(path)
    points = []
    for chip, fn, kernel, fig, note in sorted(rows, key=lambda r: r[4].get("bench", "")):
        if chip != "sm_90" or "bench" not in note or note["bench"] not in times:
            continue
        T = note["tokens"]
        issue_us = fig["instr_per_token"] * T / (ISSUE_SMS * ISSUE_SCHEDULERS * ISSUE_GHZ * 1e3)
        mb = fbytes.get(fn, 0) / 1e6
        hbm_us = mb * 1e6 / (copy_gbs * 1e3) if copy_gbs else 0.0
        points.append((note["bench"], T, fig["instr_per_token"], issue_us, mb, hbm_us,
                       max(issue_us, hbm_us), times[note["bench"]]))
    return points, copy_gbs, device


def write_calibration(f, path, options, rows, fbytes, notes):
    points, copy_gbs, device = calibration_points(path, rows, fbytes)
    f.write(f"\n## Calibration: {os.path.basename(path)}\n\n{device}\n\n")
    f.write(f"Kernels lowered with `{options or 'the current defaults'}`.\n\n")
    f.write(f"issue = warp instructions per token x T / ({ISSUE_SMS} SMs x {ISSUE_SCHEDULERS} schedulers "
            f"x {ISSUE_GHZ} GHz); HBM = the case's bytes (arguments and results, each once) / the "
            f"run's measured copy bandwidth ({fmt(copy_gbs)} GB/s); bound = the larger.\n\n")
    f.write("| case | T | instr/token | issue (us) | MB | HBM (us) | bound (us) | measured (us) "
            "| measured / issue | measured / bound |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for case, T, ipt, issue_us, mb, hbm_us, bound, meas in points:
        f.write(f"| {case} | {T} | {fmt(ipt)} | {issue_us:.1f} | {mb:.1f} | "
                f"{hbm_us:.1f} | {bound:.1f} | {meas:g} | {meas / issue_us:.2f} | {meas / bound:.2f} |\n")
    if not points:
        return
    ratios = sorted(p[7] / p[6] for p in points)
    median = ratios[len(ratios) // 2]
    f.write(f"\nmeasured / bound: {min(ratios):.2f}-{max(ratios):.2f} over {len(points)} cases (median "
            f"{median:.2f}).\n")
    # Variants this run did not measure (`predicts=CASE`): their static bound
    # times the run's median measured / bound, beside the measured kernel.
    times, _copy, _device = parse_results(path)
    pred = []
    for chip, fn, kernel, fig, note in sorted(rows, key=lambda r: r[1]):
        case = note.get("predicts")
        if chip != "sm_90" or case not in times or not fig.get("instr_per_token"):
            continue
        T = note["tokens"]
        issue_us = fig["instr_per_token"] * T / (ISSUE_SMS * ISSUE_SCHEDULERS * ISSUE_GHZ * 1e3)
        mb = fbytes.get(fn, 0) / 1e6
        hbm_us = mb * 1e6 / (_copy * 1e3) if _copy else 0.0
        bound = max(issue_us, hbm_us)
        pred.append(f"| {fn} ({note.get('options', '')}) | {case} | {fmt(fig['instr_per_token'])} | "
                    f"{issue_us:.1f} | {hbm_us:.1f} | {bound * median:.1f} | {times[case]:g} | "
                    f"{times[case] / (bound * median):.2f}x | {hbm_us / (bound * median):.0%} |\n")
    if pred:
        f.write("\nVariants not in this run, predicted: bound x the median above; of copy: the HBM time over "
                "the predicted one (the fraction of the measured copy bandwidth it would reach).\n\n")
        f.write("| variant | in place of | instr/token | issue (us) | HBM (us) | predicted (us) | measured "
                "in place (us) | predicted speed-up | of copy |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
        for line in pred:
            f.write(line)


def write_variant_ranking(f, calibrations, fbytes):
    """Pairs of runs on one device model whose kernels differ (variants): the
    speed-up the static bounds predicted against the one measured."""
    runs = []
    for path, options, rows in calibrations:
        points, _copy, device = calibration_points(path, rows, fbytes)
        runs.append((os.path.basename(path), options or "defaults", device.split("(")[0].strip(),
                     {p[0]: p for p in points}))
    lines = []
    for i, (pa, oa, da, A) in enumerate(runs):
        for pb, ob, db, B in runs[i + 1:]:
            if da != db or oa == ob:
                continue
            for case in sorted(set(A) & set(B)):
                pred = A[case][6] / B[case][6]
                meas = A[case][7] / B[case][7]
                agree = "yes" if (pred - 1) * (meas - 1) > 0 or abs(pred - meas) < 0.1 else "no"
                lines.append(f"| {da} | {case} | {pa} ({oa}) / {pb} ({ob}) | {pred:.2f} | {meas:.2f} | {agree} |\n")
    if not lines:
        return
    f.write("\n## Ranking variants: predicted against measured\n\n")
    f.write("Time of the first run's kernel over the second's on the same device model: predicted = the ratio "
            "of the static bounds, measured = the ratio of the kernel times; same order: whether the static "
            "figures ranked the two variants as the GPU did.\n\n")
    f.write("| device | case | runs | predicted | measured | same order |\n|---|---|---|---:|---:|---|\n")
    for line in lines:
        f.write(line)


if __name__ == "__main__":
    sys.exit(main())
