#!/usr/bin/env python3
"""A performance model of the moe GPU kernels from their static figures, calibrated on the committed H100/H200
runs (issue 81, item 1). No GPU.

  perf_model.py --refresh-figures --moe-opt build/bin/moe-opt [--ptxas P --nvdisasm N]   (slow: ~1.5 min)
  perf_model.py [--out bench/results/gpu-perf-model.md]       (fast: the table from the committed figures)
  perf_model.py --check                                       (the test: the table equals the committed one)
  perf_model.py --fit                                         (prints the fitted constants; edit FIT to adopt)

Figures (bench/gpu/perf_figures.json, committed; --refresh-figures rewrites it): the benchmark's cases
(bench/cases.py:gpu_cases, the functions bench_gpu.py runs) lowered by today's moe-opt for sm_90 with
moe-lower-to-nvvm's defaults and again with `topk-rounds=redux route-map=warp` (the kernels of the runs before
the list form and the lanes mapping), assembled by ptxas and read by sass_budget.measure: per kernel the registers,
shared memory, block size, resident blocks per SM, the launch's grid (a constant of the host code; 0: the host
picks another kernel at this size) and the SASS counts. The selection and flash kernels get their dynamic figures
(instructions, MUFU, HMMA per token or per score) from the `// sass-budget:` line of the case of
test/GPU/Inputs/sass-budget-cases.mlir with the same mapping (BENCH_NOTES); every other kernel has only its static
count, which counts each instruction once a warp: a lower bound where it loops.

The model, per kernel (constants: CHIPS, STATED, FIT below), with W warps a block, B blocks, b resident blocks an
SM, I instructions a warp (dynamic, or the static lower bound), bytes its share of the function's arguments and
results (each moved once; shared among a function's kernels by their global load and store instructions):

  issue   = ceil(B / SMs) * W * max(I / 4, MUFU / 0.5, HMMA / 0.5) / clock  (4 schedulers issuing one warp
            instruction a cycle; MUFU 16 lanes and mma.sync m16n8k16 one per 2 cycles an SM)
  memory  = bytes / the run's measured copy bandwidth
  little  = bytes / (SMs * resident warps * bytes a warp has in flight / latency)  (Little's law; a warp's bytes
            in flight: its bytes over its dependent load rounds R)
  chain   = ceil(ceil(B / SMs) / b) * (R * latency + I * dependent issue / clock)  (resident rounds of an SM, each
            its warps' dependent chain: small grids)
  kernel  = max(chain, max(issue, mem) + overlap * min(issue, mem)),  mem = max(memory, little)
  case    = launches * launch + sum of kernels  (launches: kernels, memsets and copies the profiler saw)

The bound class is the largest term: issue, bandwidth (memory), latency (little or chain) or launch (when the
launches outweigh the kernels). Ratio = measured / predicted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import sass_budget as sb  # noqa: E402

FIGURES = HERE / "perf_figures.json"
TABLE = REPO / "bench" / "results" / "gpu-perf-model.md"
CASE_FILE = REPO / "test" / "GPU" / "Inputs" / "sass-budget-cases.mlir"

# The chips of the runs. SMs: the runs' own device line (132 on both). clock: the SM clock the issue-rate model of
# issue 46 states (sass_budget.ISSUE_GHZ, 1.755 GHz: the H100 SXM's clock under sustained load, below its 1.98 GHz
# boost; the H200 is the same GH100 die). The copy bandwidth is each run's own measurement (its device line).
CHIPS = {"H100": dict(sms=132, ghz=sb.ISSUE_GHZ), "H200": dict(sms=132, ghz=sb.ISSUE_GHZ)}
# Stated, not fit: a global load's latency under load (Hopper HBM: ~600-800 ns loaded, the middle taken); issue
# widths an SM: 4 schedulers of one warp instruction a cycle, MUFU 16 lanes a cycle (a warp's in 2), mma.sync
# m16n8k16 one per 2 cycles (half of the 4096 dense bf16 FLOP a cycle wgmma reaches: what mma.sync reaches is
# not published by NVIDIA; half is the conservative reading of FlashAttention-2's ~35% on the H100).
STATED = dict(latency_us=0.7, issue_per_sm=4.0, mufu_per_sm=0.5, hmma_per_sm=0.5)
# Fit on the runs (--fit: the grid point of least median |log(measured / predicted)| over the modelled cases):
# the GPU time of a launch as the profiler counts it (a kernel's ramp and drain, a memset's or a small copy's own
# time), the part of the shorter of issue and memory the kernels fail to overlap with the longer, and the cycles
# a warp waits between dependent instructions on average (ALU 4-6, SHFL/REDUX ~20-30, less where independent).
FIT = dict(launch_us=0.3, overlap=0.9, dependent_cycles=3.0)
# The model's median error (|measured / predicted - 1|, modelled kernels) may not exceed this (the test's bound).
MEDIAN_ERROR_BOUND = 0.30

# A bench case's kernel -> the case of sass-budget-cases.mlir whose `// sass-budget:` line describes its mapping
# (per variant: "old" = topk-rounds=redux route-map=warp, "new" = the defaults).
BENCH_NOTES = [
    (r"topk_(logits|probs)_T\d+_K(\d+)_k8$", "old", r"topk_\1_K\2"),
    (r"topk_(logits|probs)_T\d+_K(\d+)_k8$", "new-redux", r"topk_\1_K\2"),
    (r"topk_(?:logits|probs)_T\d+_K(\d+)_k8$", "new-list", r"topk_list_logits_K\1"),
    (r"route(?:_plan)?_deepseek_v3_T\d+$", "old", "route_deepseek_v3"),
    (r"route(?:_plan)?_deepseek_v3_T\d+$", "new", "route_lanes_deepseek_v3"),
    (r"sim_B1_N16384_D64_K16_(?:bf16|f16)$", "new", "similarity_inform_bf16_rows128_split_lazy3"),
    (r"sim_B4_N4096_D256_K64_causal_bf16$", "new", "similarity_inform_bf16_causal_d256"),
    (r"sim_topk_B1_N16384_D64_K16_k2_bf16$", "new", "similarity_inform_topk_bf16"),
]
OLD_OPTIONS = "topk-rounds=redux route-map=warp"
# Cases the old variant lowers (the others' kernels are the same under both).
OLD_CASES = r"^(topk_|route_)"

# The runs: which kernels each ran. topk/route: the variant of the figures ("old": redux and warp; "new": the
# defaults, list-redux and lanes); mma: whether its bf16 mixing ran the tensor-core kernels (otherwise the SIMT
# kernel, whose figures are the f32 case's); old_flash: its tensor-core kernels were designs (and options) deleted
# since (947e74f): no figures of today describe them, their cases are not counted. Read from each run's artifacts
# line and its kernel names.
RUNS = {
    "gpu-2026-11-22-h200": dict(commit="0a98777", variant="old", mma=False),
    "gpu-2026-11-24-h100": dict(commit="686d8d3", variant="old", mma=False),
    "gpu-2026-11-24-h100-flash-mma": dict(commit="686d8d3", variant="old", mma=True, old_flash=True),
    "gpu-2026-11-26-h200-before": dict(commit="b328b1b", variant="old", mma=True, old_flash=True),
    "gpu-2026-11-26-h200-old-kernels": dict(commit="b328b1b", variant="old", mma=False),
    "gpu-2026-11-26-h200-variants": dict(commit="b328b1b", variant="new-list", mma=True),
    "gpu-2026-11-26-h200-flash-no-lazy": dict(commit="b328b1b", variant="new-list", mma=True),
    "gpu-2026-11-26-h200": dict(commit="b328b1b", variant="new-list", mma=True),
    "gpu-2026-11-26-h200-2": dict(commit="0f50b35", variant="new", mma=True),
    "gpu-2026-11-26-h200-2-old-flash-redux": dict(commit="0f50b35", variant="new-redux", mma=True, old_flash=True),
    "gpu-2026-11-26-h200-3-switch": dict(commit="6bf1540", variant="new", mma=True),
}
# The lowering files of each op (for "changed since the run": git diff of the run's commit against HEAD).
OP_SOURCES = {
    "topk_renorm": ["TopkRenorm.cpp", "RegisterTopk.cpp", "RegisterTopk.h"],
    "route": ["Route.cpp", "RouteLanes.cpp", "RegisterTopk.cpp", "DispatchPlan.cpp"],
    "similarity_inform": ["SimilarityInform.cpp", "FlashMma.cpp", "FlashTile.cpp", "FlashMix.cpp"],
    "similarity_inform_topk": ["SimilarityInform.cpp", "FlashMma.cpp", "FlashTile.cpp", "FlashMix.cpp"],
    "attention_posterior": ["AttentionPosterior.cpp", "FlashMma.cpp"],
    "mad_dispersion": ["MadDispersion.cpp"],
    "adjacency_update": ["AdjacencyUpdate.cpp"],
    "hyper_router": ["HyperRouter.cpp", "Gemv.cpp"],
}


# ----------------------------------------------------------------------------------------------------------------
# Figures: today's SASS of the benchmark's kernels (slow; --refresh-figures)
# ----------------------------------------------------------------------------------------------------------------


def bench_functions() -> dict[str, str]:
    """{case: its func.func text} of the benchmark module bench/gpu/gen_cases.py writes."""
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "bench.gpu.gen_cases", d], cwd=REPO, check=True,
                       capture_output=True)
        text = Path(d, "bench-cases.mlir").read_text()
    return {m.group(1): m.group(0) for m in re.finditer(r"^func\.func @(\w+).*?^}\n", text, flags=re.M | re.S)}


def note_for(case: str, variant: str, kernel_fig: dict, case_notes: dict) -> tuple[str, dict]:
    """(source case, `// sass-budget:` note) describing `case`'s kernel under `variant`, or ("", {})."""
    for pattern, var, source in BENCH_NOTES:
        if not re.match(pattern, case):
            continue
        if case.startswith("topk_") and variant == "new":
            # The defaults lower both top-k kernels (list-redux): redux's rounds are REDUX, list's SHFL.
            var_here = "new-list" if kernel_fig["shfl"] else "new-redux"
        else:
            var_here = variant
        if var == var_here or (var == "new" and var_here.startswith("new")):
            src = re.sub(pattern, source, case)
            if src in case_notes:
                return src, case_notes[src]
    return "", {}


def measure_variant(args, variant: str, funcs: dict, case_notes: dict, tmp: str) -> dict:
    """{case: [kernel figures]} of `funcs` lowered for sm_90 under `variant` ("old" or "new")."""
    options = OLD_OPTIONS if variant == "old" else ""
    keep = os.path.join(tmp, variant)
    os.makedirs(keep)
    rows, failures = sb.measure(args, "sm_90", options, "".join(funcs.values()), {}, keep)
    if failures:
        raise SystemExit("\n".join(failures))
    sass, labels = {}, {}
    for name in os.listdir(keep):
        if name.endswith(".sass"):
            s, lab = sb.parse_sass(Path(keep, name).read_text())
            sass.update(s)
            labels.update(lab)
    out: dict[str, list] = {}
    for _chip, case, kernel, fig, _note in rows:
        src, note = note_for(case, variant, fig, case_notes)
        if note and kernel.startswith(note.get("kernel", "-")):
            try:
                fig.update(sb.kernel_figures(sass[kernel], labels[kernel], note))
            except ValueError:
                src, note = "", {}
        fig = {k: v for k, v in fig.items() if not k.endswith("_span")}
        fig.update(kernel=kernel, note_case=src, note=note,
                   ldst=sum(1 for _a, _p, op, _o in sass[kernel] if re.match(r"(LDG|STG|RED|ATOM)", op)),
                   hmma=sum(1 for _a, _p, op, _o in sass[kernel] if sb.is_class(op, "HMMA")),
                   load_loops=load_loops(sass[kernel], labels[kernel]))
        out.setdefault(case, []).append(fig)
    return out


def load_loops(insts, labels) -> int:
    """Loops (backward-branch spans) holding a global load: each at least one dependent load round more."""
    body = [i for i in insts if i[2] != "NOP"]
    return sum(1 for a, b in sb.loops_of(body, labels)
               if any(a <= x <= b and sb.is_class(op, "LDG") for x, _p, op, _o in body))


def changed_since(commits) -> dict:
    """{commit: {op: whether its lowering files changed between the commit and HEAD}}."""
    out = {}
    for c in commits:
        out[c] = {}
        for op, files in OP_SOURCES.items():
            paths = [f"lib/Conversion/MoEToGPU/{f}" for f in files]
            r = subprocess.run(["git", "diff", "--quiet", c, "HEAD", "--", *paths], cwd=REPO)
            out[c][op] = r.returncode != 0
    return out


def refresh_figures(args) -> None:
    funcs = bench_functions()
    case_notes = sb.budget_notes(CASE_FILE.read_text())
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="moe-perf-") as tmp:
        new = measure_variant(args, "new", funcs, case_notes, tmp)
        old = measure_variant(args, "old", {c: t for c, t in funcs.items() if re.match(OLD_CASES, c)},
                              case_notes, tmp)
    doc = {"generated_by": "bench/gpu/perf_model.py --refresh-figures", "commit": head, "chip": "sm_90",
           "bytes": sb.function_bytes("".join(funcs.values())),
           "changed_since": changed_since(sorted({r["commit"] for r in RUNS.values()})),
           "variants": {"new": new, "old": old}}
    FIGURES.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIGURES}: {sum(map(len, new.values())) + sum(map(len, old.values()))} kernels")


# ----------------------------------------------------------------------------------------------------------------
# The runs
# ----------------------------------------------------------------------------------------------------------------


def load_runs() -> list[dict]:
    """[{name, chip, copy_gbs, cases: [{case, op, params, measured_us, launches, names}]}] of RUNS."""
    runs = []
    for name in RUNS:
        base = REPO / "bench" / "results" / name
        if base.with_suffix(".json").exists():
            doc = json.loads(base.with_suffix(".json").read_text())
            m = doc["machine"]
            cases = [dict(case=r["case"], op=r["op"], params=r["params"], measured_us=r["ours_kernel"]["kernel_us"],
                          launches=r["ours_kernel"]["kernels_per_call"], names=r["ours_kernel"].get("names", []))
                     for r in doc["records"] if (r.get("ours_kernel") or {}).get("kernel_us")]
            gpu, copy = m["gpu"], m["copy_bandwidth_Bps"] / 1e9
        else:  # a run committed as markdown only: its kernel times and device line
            times, copy, device = sb.parse_results(str(base.with_suffix(".md")))
            gpu = device
            cases = [dict(case=c, op=op_of(c), params=params_of(c), measured_us=us, launches=None, names=[])
                     for c, us in times.items()]
        chip = "H200" if "H200" in gpu else "H100"
        runs.append(dict(name=name, chip=chip, copy_gbs=copy, cases=cases, **RUNS[name]))
    return runs


def op_of(case: str) -> str:
    return {"topk": "topk_renorm", "route": "route", "sim": "similarity_inform"}.get(case.split("_")[0], "?")


def params_of(case: str) -> dict:
    return {k: int(v) for k, v in re.findall(r"_([A-Z])(\d+)", case)}


# ----------------------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------------------


def kernels_of(run: dict, case: dict, figures: dict) -> tuple[list, str]:
    """(the kernel figures `case` ran in `run`, a remark on where they come from)."""
    variants = figures["variants"]
    name, variant = case["case"], run["variant"]
    remark = ""
    if re.match(OLD_CASES, name):
        if name.startswith("topk_") and variant != "old":
            figs = variants["old"][name] if variant == "new-redux" else variants["new"][name]
            if variant == "new-list":
                figs = [dict(f, grid_blocks=f["grid_blocks"] or note_grid(f, case)) for f in figs if f["shfl"]]
        else:
            figs = variants["old" if variant == "old" else "new"][name]
    else:
        simt = not run["mma"] or (case["names"] and not any("mma" in n for n in case["names"]))
        if simt and re.search(r"_(bf16|f16)$", name) and any(f["hmma"] for f in variants["new"][name]):
            name = re.sub(r"_(bf16|f16)$", "", name)
            remark = "SIMT kernel ran: the f32 case's figures"
        figs = variants["new"][name]
    return [f for f in figs if f["grid_blocks"]], remark


def note_grid(fig: dict, case: dict) -> int:
    """Blocks of a selection kernel at the case's tokens (one the host does not launch at this size today)."""
    tpw = fig["note"].get("tokens-per-warp", 1)
    return math.ceil(case["params"]["T"] / (tpw * fig["threads"] // 32))


def scores(params: dict) -> float:
    n = params["N"]
    return params.get("B", 1) * n * n * ((n + 1) / (2 * n) if params.get("causal") else 1.0)


def warp_work(fig: dict, params: dict) -> tuple[float, float, float, bool]:
    """(instructions, MUFU, HMMA) a warp issues and whether they are dynamic (modelled) or the static count."""
    warps = fig["grid_blocks"] * fig["threads"] / 32
    note = fig["note"]
    if "instr_per_token" in fig and fig["instr_per_token"]:
        tpw = note.get("tokens-per-warp", 1)
        return fig["instr_per_token"] * tpw, fig["mufu_per_token"] * tpw, 0.0, True
    if "instr_per_score" in fig:
        per_warp = scores(params) / 32 / warps
        return (fig["instr_per_score"] * per_warp, fig["per_score"]["MUFU"] * per_warp,
                fig["per_score"]["HMMA"] * per_warp, True)
    # Straight-line code (no loop): the static count is the dynamic one.
    return float(fig["instructions"]), float(fig["mufu"]), float(fig["hmma"]), not fig["loops"]


def kernel_terms(fig: dict, params: dict, nbytes: float, chip: dict, copy_gbs: float, fit: dict) -> dict:
    """The bound terms (us) of one kernel and its predicted time."""
    ghz, sms = chip["ghz"], chip["sms"]
    instr, mufu, hmma, modelled = warp_work(fig, params)
    warps_block = fig["threads"] / 32
    blocks_sm = math.ceil(fig["grid_blocks"] / sms)
    per_warp_cycles = max(instr / STATED["issue_per_sm"], mufu / STATED["mufu_per_sm"], hmma / STATED["hmma_per_sm"])
    issue = blocks_sm * warps_block * per_warp_cycles / (ghz * 1e3)
    memory = nbytes / (copy_gbs * 1e3)
    rounds = 1 + fig["load_loops"]
    warps = fig["grid_blocks"] * warps_block
    in_flight = min(warps, sms * fig["warps_per_sm"]) * (nbytes / warps / rounds)
    little = nbytes / (in_flight / STATED["latency_us"]) if nbytes else 0.0
    chain = (math.ceil(blocks_sm / max(fig["blocks_per_sm"], 1))
             * (rounds * STATED["latency_us"] + instr * fit["dependent_cycles"] / (ghz * 1e3)))
    mem = max(memory, little)
    total = max(chain, max(issue, mem) + fit["overlap"] * min(issue, mem))
    return dict(issue=issue, memory=memory, little=little, chain=chain, total=total, modelled=modelled,
                instr=instr, rounds=rounds)


def predict_case(run: dict, case: dict, figures: dict, fit: dict = FIT) -> dict:
    figs, remark = kernels_of(run, case, figures)
    fbytes = figures["bytes"].get(case["case"], 0)
    ldst = sum(f["ldst"] for f in figs) or 1
    chip = CHIPS[run["chip"]]
    terms = [kernel_terms(f, case["params"], fbytes * f["ldst"] / ldst, chip, run["copy_gbs"], fit) for f in figs]
    launches = case["launches"] or len(figs)
    launch = launches * fit["launch_us"]
    predicted = launch + sum(t["total"] for t in terms)
    gone = run.get("old_flash") and any(f["hmma"] for f in figs)
    if gone:
        remark = "tensor-core kernel of a deleted design: today's figures, not counted"
    return dict(run=run["name"], chip=run["chip"], case=case["case"], op=case["op"], measured=case["measured_us"],
                predicted=predicted, launch=launch, launches=launches, kernels=[f["kernel"] for f in figs],
                terms=terms, kind=case_kind(terms), modelled=not gone and modelled_share(terms) >= 0.5, remark=remark,
                bytes=fbytes, changed=figures["changed_since"][run["commit"]].get(case["op"]))


def modelled_share(terms: list[dict]) -> float:
    """The part of a case's predicted kernel time in kernels whose instructions are known (the error statistics
    count a case whose share is at least half)."""
    total = sum(t["total"] for t in terms)
    return sum(t["total"] for t in terms if t["modelled"]) / total if total else 0.0


def case_kind(terms: list[dict]) -> str:
    """dynamic: every kernel's instructions known; partly: some (a static kernel beside, e.g. a combine or the
    plan's scan); static: none (lower bounds)."""
    known = [t["modelled"] for t in terms]
    return "dynamic" if all(known) else "partly" if any(known) else "static"


def bound_class(p: dict) -> tuple[str, str]:
    """(issue | bandwidth | latency | launch, the evidence) of a predicted case: its largest term."""
    sums = {"issue": sum(t["issue"] for t in p["terms"]),
            "bandwidth": sum(t["memory"] for t in p["terms"]),
            "latency": sum(max(t["little"], t["chain"]) for t in p["terms"]),
            "launch": p["launch"]}
    cls = max(sums, key=sums.get)
    ev = ", ".join(f"{k} {v:.3g}" for k, v in sums.items())
    return cls, ev


def predict_all(figures: dict, fit: dict = FIT, runs: list | None = None) -> list[dict]:
    return [predict_case(run, c, figures, fit) for run in runs or load_runs() for c in run["cases"]]


def errors(preds: list[dict], modelled_only: bool = True) -> list[float]:
    """|log(measured / predicted)| of the cases (the modelled ones)."""
    return [abs(math.log(p["measured"] / p["predicted"])) for p in preds if p["modelled"] or not modelled_only]


def summary(preds: list[dict], chip: str | None = None, modelled_only: bool = True) -> tuple[float, float, int]:
    """(median, worst) of |measured / predicted - 1| as a factor's excess (e^|log| - 1), and the count."""
    e = errors([p for p in preds if chip in (None, p["chip"])], modelled_only)
    if not e:
        return float("nan"), float("nan"), 0
    return math.exp(statistics.median(e)) - 1, math.exp(max(e)) - 1, len(e)


def fit_constants(figures: dict) -> dict:
    """The launch time and overlap minimizing the median error of the modelled cases (a grid search)."""
    best = None
    runs = load_runs()
    for launch in [x / 10 for x in range(0, 31)]:
        for overlap in [x / 10 for x in range(0, 11)]:
            for cycles in [x / 2 for x in range(2, 21)]:
                fit = dict(launch_us=launch, overlap=overlap, dependent_cycles=cycles)
                e = errors(predict_all(figures, fit, runs))
                score = (round(statistics.median(e), 4), max(e))
                if best is None or score < best[0]:
                    best = (score, fit)
    return best[1]


# ----------------------------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------------------------


def fmt_us(v: float) -> str:
    return f"{v:.3g}" if v < 1000 else f"{v:.0f}"


def write_table(preds: list[dict], figures: dict) -> str:
    lines = ["# The GPU performance model against the runs", "",
             "Generated by `bench/gpu/perf_model.py` (issue 81, item 1; the method is its docstring) from "
             f"bench/gpu/perf_figures.json (today's SASS, commit {figures['commit']}, sm_90) and the runs' kernel "
             "times (bench/results/gpu-*.json, torch.profiler's GPU time of one call); "
             "`python/tests/test_perf_model.py` regenerates it and fails when it differs.", "",
             "Constants: " + ", ".join(f"{c}: {v['sms']} SMs at {v['ghz']} GHz" for c, v in CHIPS.items())
             + "; copy bandwidth: each run's own. Stated: " + ", ".join(f"{k} {v}" for k, v in STATED.items())
             + ". Fit (median error of the modelled kernels): " + ", ".join(f"{k} {v}" for k, v in FIT.items())
             + ".", ""]
    lines += summary_lines(preds)
    lines += ["", "## Per run and case", "",
              "ratio = measured / predicted. terms (us, summed over the case's kernels): issue, memory (bytes at the "
              "copy bandwidth), little (bytes in flight against the latency), chain (dependent latency of a "
              "resident round), launch (its count). instr: dynamic where every kernel's instructions a warp are known "
              "(per token or per score from the case's `// sass-budget:` line, or straight-line code), static where "
              "none are (each instruction once a warp: a lower bound where the kernel loops), partly between; the "
              "error statistics count the cases with at least half their predicted time in known kernels. SASS "
              "changed: the op's lowering files differ between the run's commit and "
              "the figures' (the SASS is today's either way).", "",
              "| run | case | kernels | measured (us) | predicted (us) | ratio | bound | issue | memory | little "
              "| chain | launch | instr | SASS changed | remark |",
              "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|---|"]
    for p in preds:
        cls, _ev = bound_class(p)
        t = lambda k: fmt_us(sum(x[k] for x in p["terms"]))  # noqa: E731
        lines.append(f"| {p['run'].removeprefix('gpu-2026-')} | {p['case']} | {' '.join(p['kernels'])} | "
                     f"{fmt_us(p['measured'])} | {fmt_us(p['predicted'])} | {p['measured'] / p['predicted']:.2f} | "
                     f"{cls} | {t('issue')} | {t('memory')} | {t('little')} | {t('chain')} | "
                     f"{fmt_us(p['launch'])} ({p['launches']:g}) | {p['kind']} | "
                     f"{'yes' if p['changed'] else 'no'} | {p['remark'] or '-'} |")
    return "\n".join(lines) + "\n"


def summary_lines(preds: list[dict]) -> list[str]:
    out = ["## The model's error", "",
           "error = |measured / predicted - 1| taken as a factor (a case 2x off either way: 100%); modelled: the "
           "cases with at least half their predicted time in kernels whose instructions a warp are known.", "",
           "| chip | kernels | cases | median error | worst |", "|---|---|---:|---:|---:|"]
    for chip in ("H100", "H200", None):
        for modelled in (True, False):
            med, worst, n = summary(preds, chip, modelled)
            out.append(f"| {chip or 'both'} | {'modelled' if modelled else 'all (static ones too)'} | {n} | "
                       f"{med:.0%} | {worst:.0%} |")
    out += ["", "Bound class per family (all cases; the count of each class):", ""]
    fams: dict[str, dict] = {}
    for p in preds:
        fam = re.sub(r"_T\d+.*|_B\d+.*|_De.*", "", p["case"])
        cls, _ = bound_class(p)
        fams.setdefault(fam, {}).setdefault(cls, 0)
        fams[fam][cls] += 1
    for fam, classes in fams.items():
        out.append(f"- {fam}: " + ", ".join(f"{c} {n}" for c, n in sorted(classes.items(), key=lambda kv: -kv[1])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--refresh-figures", action="store_true")
    ap.add_argument("--moe-opt", default=str(REPO / "build" / "bin" / "moe-opt"))
    ap.add_argument("--ptxas", default="/usr/local/cuda/bin/ptxas")
    ap.add_argument("--nvdisasm", default=str(REPO / ".venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvdisasm"))
    ap.add_argument("--out", default=str(TABLE))
    ap.add_argument("--check", action="store_true", help="fail when the table differs from --out or the median "
                    f"error of the modelled cases exceeds {MEDIAN_ERROR_BOUND:.0%}")
    ap.add_argument("--fit", action="store_true")
    args = ap.parse_args()
    if args.refresh_figures:
        refresh_figures(args)
    figures = json.loads(FIGURES.read_text())
    if args.fit:
        print("fit:", fit_constants(figures))
        return 0
    preds = predict_all(figures)
    table = write_table(preds, figures)
    med, worst, n = summary(preds)
    print(f"perf model: {len(preds)} cases, {n} modelled: median error {med:.0%}, worst {worst:.0%}")
    if args.check:
        bad = []
        if not Path(args.out).exists() or Path(args.out).read_text() != table:
            bad.append(f"{args.out} differs from the regenerated table (run bench/gpu/perf_model.py)")
        if not med <= MEDIAN_ERROR_BOUND:
            bad.append(f"median error {med:.0%} over the bound {MEDIAN_ERROR_BOUND:.0%}")
        for b in bad:
            print("FAIL:", b, file=sys.stderr)
        return 1 if bad else 0
    Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ----------------------------------------------------------------------------------------------------------------
# The budget's figure: a selection kernel's predicted time (sass_budget.py)
# ----------------------------------------------------------------------------------------------------------------

# Issue 81 item 2's targets, judged on the model's prediction at the H200's figures: topk_renorm at this fraction
# of the copy bandwidth at T = 65536; route at T <= 64 within route_t64_us; DeepSeek-V3's route and plan at
# T = 8192 within route_plan_us in at most plan_launches launches.
TARGETS = dict(topk_copy_fraction=0.8, route_t64_us=2.0, route_plan_us=10.0, plan_launches=2)
# The H200's measured copy bandwidth of its newest run (gpu-2026-11-26-h200-2: 4209 GB/s).
H200_COPY_GBS = 4209.0


def predicted_us(fig: dict, note: dict, tokens: int, nbytes: float, chip: str = "H200") -> float:
    """The model's time (us, one launch included) of a selection kernel of sass_budget.py's figures (`fig`, its
    `// sass-budget:` line `note`) at `tokens` tokens moving `nbytes`."""
    tpw = note.get("tokens-per-warp", 1)
    f = dict(fig, note=note, load_loops=0, hmma=0,
             grid_blocks=math.ceil(tokens / (tpw * fig["threads"] // 32)))
    return FIT["launch_us"] + kernel_terms(f, {"T": tokens}, nbytes, CHIPS[chip], H200_COPY_GBS, FIT)["total"]


def topk_target_us(nbytes: float) -> float:
    """The time at which topk_renorm moves `nbytes` at TARGETS' fraction of the H200's copy bandwidth."""
    return nbytes / (TARGETS["topk_copy_fraction"] * H200_COPY_GBS * 1e3)
