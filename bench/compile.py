"""Compile latency: what a user waits for before the first result.

  .venv/bin/python -m bench.compile [--threads 2] [--repeats 3] [--only SUBSTR ...] [--no-blocks] [--tag TAG]

1. **The first call of each torch op** (``torch.ops.moe.*`` at the common configurations of
   ``moe_mlir.runtime.prebuild.COMMON_CALLS``, one token), each in a NEW process:
   *cold* (an empty kernel cache: the kernel is compiled, in process) and *warm* (the cache the
   cold process filled: what every process after the set-up's prebuild sees), ``--repeats`` warm processes, median.
   Also the process's ``import torch`` and ``import moe_mlir`` times. Target (issue 36): warm first call <= 50 ms.
2. **torch.compile of the demo's blocks** (``moe_mlir.demo``: DeepSeek-V3 routing from the logits, T = 4096; the
   Similarity-Inform router's training step, forward + backward), ``backend="moe"`` against ``backend="inductor"``:
   ``moe_mlir.demo.compare_compiles``, the demo's own measurement. Per backend a fresh process with every cache
   empty in a directory of its own (``$MOE_KERNEL_CACHE`` with the raised graphs, ``TORCHINDUCTOR_CACHE_DIR``,
   ``TRITON_CACHE_DIR``): *cold*; then a second fresh process with those caches: *warm* (a second run of the
   user's program). Reported: the first call (inductor's import, tracing, raising, kernel builds, compiling and one
   run, with the stages' times) and a steady call. Target: ``backend="moe"``'s compile <= 1.2x inductor's.

3. **The kernel build, stage by stage** (one fresh process over the kernels of part 1's calls): the in-process
   compiler (``libmoe_compiler.so``: pipeline, translation, LLVM optimizer, code generation, lld's link), and the
   subprocess chain it replaced (``moe-opt``, ``mlir-translate``, ``clang -O3 -shared``), kernel by kernel in the
   same process; the compiler library's one-time cost (its load; the registration of the passes is in the first
   build) apart. Also one CUDA kernel (sm_90, no GPU needed): in process (the one CUDA recipe) against the
   ``moe-aot.py`` command line (moe-opt, mlir-translate, llc, c++ -shared). ``--no-stages``
   skips it.

Writes bench/results/compile-<date>-t<threads>[-TAG].{json,md}. Timings on a shared machine move with its load (the
load average is recorded); the cold/warm and moe/inductor comparisons are same-run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

# ----------------------------------------------------------------------------------------------------------------
# Children (each measurement is one fresh interpreter)
# ----------------------------------------------------------------------------------------------------------------


def child_op(name: str) -> dict:
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    import moe_mlir  # noqa: F401
    from moe_mlir.runtime import cache
    from moe_mlir.runtime.prebuild import COMMON_CALLS

    t2 = time.perf_counter()
    # The kernel lookup (moe_mlir.runtime.cache.load, which the extension calls on an in-memory miss), timed apart
    # from the rest of the call (dispatch, allocation, the kernel: on a busy machine, the wait for torch's OpenMP
    # team that runs it).
    from moe_mlir import ops
    from moe_mlir.runtime import extension

    lookup = [0.0]

    def timed_load(*a):
        s = time.perf_counter()
        try:
            return cache.load(*a)
        finally:
            lookup[0] += time.perf_counter() - s

    if extension._lib is not None:
        extension._lib.moeTorchSetLoader(timed_load, ops._autograd_call)
    call = COMMON_CALLS[name]
    s = time.perf_counter()
    call(torch)
    first = time.perf_counter() - s
    s = time.perf_counter()
    call(torch)
    second = time.perf_counter() - s
    return {"import_torch_ms": (t1 - t0) * 1e3, "import_moe_mlir_ms": (t2 - t1) * 1e3, "first_call_ms": first * 1e3,
            "kernel_lookup_ms": lookup[0] * 1e3,
            "second_call_ms": second * 1e3, "compiles": cache.stats.compiles, "disk_loads": cache.stats.disk_loads}


def child_stages(keys_file: str, threads: int) -> dict:
    """Part 3 in this (fresh) process: each kernel of ``keys_file`` built in process and by the subprocess chain."""
    import shutil

    from moe_mlir.runtime import cache, compiler, driver
    from moe_mlir.runtime.locate import LLVM_BIN, find_moe_aot, find_moe_opt, find_runtime_lib

    keys = list(dict.fromkeys(k for k in Path(keys_file).read_text().splitlines() if k.strip()))
    rt = find_runtime_lib("libmoe_kernel_runtime.so")
    moe_opt = find_moe_opt()
    clang_rt = subprocess.run([str(LLVM_BIN / "clang"), "--rtlib=compiler-rt", "-print-libgcc-file-name"],
                              capture_output=True, text=True).stdout.strip()
    out: dict = {"kernels": []}
    work = Path(tempfile.mkdtemp(prefix="moe-stages-"))
    try:
        s = time.perf_counter()
        compiler._library()
        out["library_load_s"] = time.perf_counter() - s
        for n, key in enumerate(keys):
            k = cache.parse_key(key)
            mlir = cache.kernel_module(k)
            pipeline = f"canonicalize,moe-lower-to-llvm{{num-threads={threads} target-cpu=native results-to-out-params=true}}"
            rec: dict = {"key": key}
            s = time.perf_counter()
            rec["in_process"] = compiler.compile_kernel(mlir, pipeline, work / f"k{n}-ours.so", "native", 3,
                                                        driver._link_args(rt))
            rec["in_process"]["total"] = time.perf_counter() - s
            (work / f"k{n}.mlir").write_text(mlir)
            chain = {}
            steps = [("moe-opt", [moe_opt, "--canonicalize", f"--moe-lower-to-llvm=num-threads={threads} "
                                  "target-cpu=native results-to-out-params=true", str(work / f"k{n}.mlir"), "-o",
                                  str(work / f"k{n}.llvm.mlir")]),
                     ("mlir-translate", [str(LLVM_BIN / "mlir-translate"), "--mlir-to-llvmir",
                                         str(work / f"k{n}.llvm.mlir"), "-o", str(work / f"k{n}.ll")]),
                     ("clang", [str(LLVM_BIN / "clang"), "-O3", "-march=native", "-fPIC", "-shared",
                                "-Wno-override-module", str(work / f"k{n}.ll"), *([clang_rt] if clang_rt else []),
                                f"-L{Path(rt).parent}", "-lmoe_kernel_runtime", f"-Wl,-rpath,{Path(rt).parent}",
                                "-o", str(work / f"k{n}.so")])]
            for name, cmd in steps:
                s = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                chain[name] = time.perf_counter() - s
            chain["total"] = sum(chain.values())
            rec["subprocesses"] = chain
            out["kernels"].append(rec)
        # One CUDA kernel for sm_90: in process, and by moe-aot.py (moe-opt, mlir-translate, llc, c++ -shared).
        key = "topk_renorm|k=8|mode=logits|renormalize=1|in:scores:f32:?x256|device=cuda:0"
        k = cache.parse_key(key)
        cuda: dict = {"key": key, "format": driver.cuda_binary_format()}
        s = time.perf_counter()
        cuda_rt = find_runtime_lib("libmoe_cuda_runtime.so")
        driver.build_cuda_kernel(cache.kernel_module(k), work / "cuda-ours.so", cuda_rt or rt, "sm_90")
        cuda["in_process_s"] = time.perf_counter() - s
        aot = find_moe_aot()
        if cuda_rt and moe_opt and aot and shutil.which("c++"):
            # The subprocess chain the in-process recipe replaced: the moe-aot.py command line, same options.
            (work / "cuda.mlir").write_text(cache.kernel_module(k))
            s = time.perf_counter()
            subprocess.run([sys.executable, aot, str(work / "cuda.mlir"), "-o", str(work / "aot"), "--name", "cuda",
                            "--chip", "sm_90", "--toolkit", driver.cuda_toolkit(), "--moe-opt", moe_opt,
                            "--canonicalize", "--pipeline-options", driver.KERNEL_NVVM_OPTIONS, "--link",
                            "--runtime-dir", str(Path(cuda_rt).parent)], check=True, capture_output=True)
            cuda["moe_aot_s"] = time.perf_counter() - s
        out["cuda"] = cuda
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Parent
# ----------------------------------------------------------------------------------------------------------------


def _spawn(args: list[str], env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bench.compile", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _env(threads: int, **extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MOE_NUM_THREADS=str(threads), **extra)
    env.setdefault("MOE_BUILD_DIR", str(REPO / "build"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "python"), env.get("PYTHONPATH")) if p)
    return env


def _loadavg() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def run_ops(args, cache: Path) -> list[dict]:
    from moe_mlir.runtime.prebuild import COMMON_CALLS  # noqa: E402  (a light import: no torch)

    names = [n for n in COMMON_CALLS if not args.only or any(s in n for s in args.only)]
    out = []
    for name in names:
        env = _env(args.threads, MOE_KERNEL_CACHE=str(cache / "ops"), MOE_KERNEL_RECORD=str(cache / "keys.txt"))
        rec = {"op": name, "loadavg_before": _loadavg()}
        rec["cold"] = _spawn(["--child-op", name], env)
        warm = [_spawn(["--child-op", name], env) for _ in range(args.repeats)]
        rec["warm_runs"] = warm
        rec["warm"] = {k: statistics.median(r[k] for r in warm) for k in warm[0]}
        print(f"{name:58s} cold {rec['cold']['first_call_ms']:8.1f} ms ({rec['cold']['compiles']} compiled)   "
              f"warm {rec['warm']['first_call_ms']:6.2f} ms ({int(rec['warm']['disk_loads'])} from disk, lookup "
              f"{rec['warm']['kernel_lookup_ms']:.2f} ms, second call {rec['warm']['second_call_ms']:.2f} ms)   "
              f"import moe_mlir {rec['warm']['import_moe_mlir_ms']:6.0f} ms", flush=True)
        out.append(rec)
    return out


def run_stages(args, cache: Path) -> dict:
    keys = cache / "keys.txt"
    if not keys.is_file():
        from moe_mlir.runtime.prebuild import COMMON_CALLS  # noqa: E402

        # Part 1 did not run: record the kernels of the common calls.
        for name in COMMON_CALLS:
            if not args.only or any(s in name for s in args.only):
                _spawn(["--child-op", name], _env(args.threads, MOE_KERNEL_CACHE=str(cache / "ops"),
                                                  MOE_KERNEL_RECORD=str(keys)))
    rec = {"loadavg_before": _loadavg()}
    rec.update(_spawn(["--child-stages", str(keys), "--threads", str(args.threads)], _env(args.threads)))
    ins = sum(k["in_process"]["total"] for k in rec["kernels"])
    sub = sum(k["subprocesses"]["total"] for k in rec["kernels"])
    print(f"kernel builds ({len(rec['kernels'])}): in process {ins:.2f} s (+ {rec['library_load_s']:.2f} s loading "
          f"the compiler), subprocesses {sub:.2f} s ({sub / ins:.2f}x); CUDA sm_90: in process "
          f"{rec['cuda']['in_process_s']:.2f} s, moe-aot.py {rec['cuda'].get('moe_aot_s', float('nan')):.2f} s",
          flush=True)
    return rec


def run_blocks(args, cache: Path) -> list[dict]:
    # moe_mlir.demo.compare_compiles: the demo's own measurement (one implementation), here at --threads.
    from moe_mlir import demo

    out = []
    for block in demo.COMPILE_BLOCKS:
        if args.only and not any(s in block for s in args.only):
            continue
        rec: dict = {"block": block, "loadavg_before": _loadavg()}
        rec.update(demo.compare_compiles(block, _env(args.threads), workdir=cache))
        for c in ("cold", "warm"):
            rec[f"compile_ratio_{c}"] = rec["moe"][c]["first_call_s"] / rec["inductor"][c]["first_call_s"]
        print(f"{block:22s} cold: moe {rec['moe']['cold']['first_call_s']:.2f} s, inductor "
              f"{rec['inductor']['cold']['first_call_s']:.2f} s ({rec['compile_ratio_cold']:.2f}x); warm: moe "
              f"{rec['moe']['warm']['first_call_s']:.2f} s, inductor {rec['inductor']['warm']['first_call_s']:.2f} s "
              f"({rec['compile_ratio_warm']:.2f}x)", flush=True)
        out.append(rec)
    return out


def _markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [f"# Compile latency ({doc['date'][:10]})", "",
             f"Machine: {m['cpu_model']} ({m['cpus']} logical CPUs), {doc['threads']} threads, torch {m['torch']}, "
             f"commit {doc['commit']}. Load average at start {doc['loadavg_start']}, at end {doc['loadavg_end']} "
             "(a shared machine: compare within the run).", "",
             "## First call of each torch op (bench/compile.py part 1)", "",
             "Each cell is a new process; *cold*: empty kernel cache (the kernel is compiled), *warm*: the cache the "
             f"cold process filled (median of {doc['repeats']} processes). Target: warm first call <= 50 ms. *lookup*: the part of the warm first "
             "call spent finding and loading the cached kernel (moe_mlir.runtime.cache.load); the rest is the call "
             "itself, whose floor the second call shows.", "",
             "| op (common configuration) | cold first call | warm first call | of it lookup | warm second call | "
             "import moe_mlir (warm) | import torch |", "|---|---|---|---|---|---|---|"]
    for r in doc["ops"]:
        c, w = r["cold"], r["warm"]
        lines.append(f"| {r['op']} | {c['first_call_ms']:.0f} ms ({c['compiles']} compiled) | "
                     f"{w['first_call_ms']:.2f} ms | {w['kernel_lookup_ms']:.2f} ms | {w['second_call_ms']:.3f} ms | {w['import_moe_mlir_ms']:.0f} ms | "
                     f"{w['import_torch_ms']:.0f} ms |")
    if doc["ops"]:
        worst = max(r["warm"]["first_call_ms"] for r in doc["ops"])
        lines += ["", f"Slowest warm first call: {worst:.2f} ms "
                  f"({'meets' if worst <= 50 else 'MISSES'} the 50 ms target)."]
    st = doc.get("stages")
    if st:
        lines += ["", "## The kernel build, stage by stage (part 3)", "",
                  "One fresh process, kernel by kernel: the in-process compiler (libmoe_compiler.so) against the "
                  "subprocess chain it replaced, in the same process; both make a shared object, loaded the same way "
                  "(dlopen). Seconds.", "",
                  "| kernel | mlir | translate | optimize | codegen | link | in process | moe-opt | "
                  "mlir-translate | clang -O3 -shared | subprocesses | ratio |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        tin = tsub = 0.0
        for r in st["kernels"]:
            i, c = r["in_process"], r["subprocesses"]
            a, b = i["total"], c["total"]
            tin, tsub = tin + a, tsub + b
            key = r["key"][:60].replace("|", "\\|")
            lines.append(f"| `{key}` | {i['mlir']:.3f} | {i['translate']:.3f} | {i['optimize']:.3f} | "
                         f"{i['codegen']:.3f} | {i['link']:.4f} | {a:.3f} | {c['moe-opt']:.3f} | "
                         f"{c['mlir-translate']:.3f} | {c['clang']:.3f} | {b:.3f} | {b / a:.2f}x |")
        lines += [f"| **all {len(st['kernels'])}** | | | | | | **{tin:.2f}** | | | | **{tsub:.2f}** | "
                  f"**{tsub / tin:.2f}x** |", "",
                  f"Once per process, before the first in-process build: loading the compiler library "
                  f"{st['library_load_s']:.3f} s (the first build also registers the passes and dialects: in its "
                  "mlir column). "
                  f"CUDA (`{st['cuda']['key']}`, sm_90, {st['cuda']['format']}): in process "
                  f"{st['cuda']['in_process_s']:.2f} s, moe-aot.py {st['cuda'].get('moe_aot_s', float('nan')):.2f} s."]
    if doc["blocks"]:
        lines += ["", "## torch.compile of the demo's blocks: backend=\"moe\" vs backend=\"inductor\" (part 2)", "",
                  "Each cell is a new process (moe_mlir.demo.compare_compiles). First call = from the torch.compile "
                  "call to the first result, with inductor's import: resolving the backend, Dynamo's tracing, "
                  "(raising, building the moe kernels,) inductor's compile and one run. *cold*: every cache empty "
                  "(kernel cache and raised graphs, inductor's, Triton's), a directory per backend; *warm*: the "
                  "second process with the caches the first filled. Target: moe <= 1.2x inductor.", "",
                  "| block | moe first call (cold) | inductor first call (cold) | ratio | moe (warm) | inductor (warm) "
                  "| ratio | moe steady call | inductor steady call |", "|---|---|---|---|---|---|---|---|---|"]
        for r in doc["blocks"]:
            mc, ic = r["moe"]["cold"], r["inductor"]["cold"]
            mw, iw = r["moe"]["warm"], r["inductor"]["warm"]
            lines.append(f"| {r['block']} | {mc['first_call_s']:.2f} s | {ic['first_call_s']:.2f} s | "
                         f"{r['compile_ratio_cold']:.2f}x | {mw['first_call_s']:.2f} s | "
                         f"{iw['first_call_s']:.2f} s | {r['compile_ratio_warm']:.2f}x | "
                         f"{mw['steady_call_ms']:.2f} ms | {iw['steady_call_ms']:.2f} ms |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="warm processes per op")
    ap.add_argument("--only", nargs="+", help="ops/blocks whose name contains one of these")
    ap.add_argument("--no-blocks", action="store_true", help="part 1 only")
    ap.add_argument("--no-ops", action="store_true", help="no part 1")
    ap.add_argument("--no-stages", action="store_true", help="no part 3")
    ap.add_argument("--tag", default="")
    ap.add_argument("--child-op", help=argparse.SUPPRESS)
    ap.add_argument("--child-stages", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_op:
        print(json.dumps(child_op(args.child_op)))
        return 0
    if args.child_stages:
        print(json.dumps(child_stages(args.child_stages, args.threads)))
        return 0

    sys.path.insert(0, str(REPO / "python"))
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    doc = {"suite": "compile", "date": datetime.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
           "repeats": args.repeats, "commit": commit, "loadavg_start": _loadavg(),
           "machine": {"cpu_model": cpu, "cpus": os.cpu_count(), "torch": torch.__version__}}
    with tempfile.TemporaryDirectory(prefix="moe-bench-compile-") as tmp:
        doc["ops"] = [] if args.no_ops else run_ops(args, Path(tmp))
        doc["stages"] = None if args.no_stages else run_stages(args, Path(tmp))
        doc["blocks"] = [] if args.no_blocks else run_blocks(args, Path(tmp))
    doc["loadavg_end"] = _loadavg()
    stem = RESULTS / f"compile-{doc['date'][:10]}-t{args.threads}{'-' + args.tag if args.tag else ''}"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    stem.with_suffix(".md").write_text(_markdown(doc))
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
