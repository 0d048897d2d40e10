#!/usr/bin/env python3
"""The GPU check: every step that the moe GPU path needs on a machine with an
NVIDIA GPU (H100/H200), PyTorch, cmake and the CUDA toolkit, but no LLVM. It
runs from the folder scripts/gpu-check.sh builds (build/gpu-check/: ahead-of-
time objects with their PTX fallbacks and manifests, the host sources, this
script), through run.sh beside it:

  bash build/gpu-check/run.sh [OUT]        (OUT: the results folder; else $OUT,
                                            else ./gpu-check-results)

Steps, in order (MOE_GPU_CHECK_STEPS=a,b,... picks some; artifacts and build always run):
  artifacts     check_artifacts.py on every manifest (toolkit named, PTX fallback, sha256s)
  build         cmake: libmoe_cpu_runtime, libmoe_cuda_runtime, libgpu-cases.so, libbench-cases.so,
                moe-cuda-runtime-fake-test
  runtime-unit  the runtime against a fake driver (no GPU needed)
  harness-unit  the harness's own unit tests (no GPU needed)
  torch-ext     torch_ext_check.py: libmoe_torch.so (built by the build step against this machine's torch) loads
                through the checkout's moe_mlir, has its CUDA kernels and registers them for every prebuilt op
                (no GPU needed; skipped with MOE_GPU_CHECK_TORCH_OPS=0)
  checks        test/GPU/run_gpu_tests.py: every op, mode, dtype and edge case vs PyTorch CUDA
  checks-ptx    the same with MOE_CUDA_FORCE_PTX=1: the PTX fallback JIT-compiled by the driver
  torch-ops     python/tests/test_torch_ops_cuda.py: torch.ops.moe.* on CUDA tensors (libmoe_torch built here,
                the kernels prebuilt in kernels/ by scripts/gpu-check.sh), when the
                checkout around this folder (or $MOE_REPO) has it; skipped with the reason if not
  torch-ops-compile  the same with no prebuilt kernel: every CUDA kernel compiled in the test's process by
                $MOE_COMPILER (libmoe_compiler.so, no LLVM needed), as fatbins with ptxas and as PTX without
                (skipped without $MOE_COMPILER; $MOE_GPU_CHECK_COMPILE_SAMPLE: a pytest -k expression)
  hf-models     python/tests/test_hf_models.py -k matches_eager on CUDA: transformers' MoE blocks and routers and the
                seed blocks through torch.compile(backend="moe") and moe_mlir.compile (inductor's Triton for the
                dense code), equal to eager at three token counts; test_grouped_mm.py's CUDA tests (the padded
                batched GEMM)
  torch-ops-bench  bench/gpu/torch_ops_cuda.py: torch.ops.moe.* on CUDA tensors vs eager, decode and prefill
                (the same prebuilt kernels; its results in bench/ of logs.tar.gz)
  memcheck      `checks` under compute-sanitizer --tool memcheck (torch's caching allocator off; API errors
                are the harness's to report)
  racecheck     `checks` under compute-sanitizer --tool racecheck
                The sanitizer steps run the cases of MOE_GPU_CHECK_SANITIZE_ONLY (e.g. "--only similarity_inform")
                when set; else, in a folder built with a flash-mma variant option (FLASH_VARIANT_OPTIONS: the second
                folder of test/GPU/README.md), the flash kernels' cases (FLASH_CASES), and in one built with
                route-map=lanes or topk-rounds=list their op's cases (VARIANT_CASES); else those of `checks`
  bench         bench/gpu/bench_gpu.py (ours vs eager vs torch.compile; $MOE_GPU_BENCH_ARGS adds options)
  profile       Nsight Compute (ncu --clock-control none) over one call of the bench's flash cases
                ($MOE_GPU_PROFILE_ONLY, bench --only substrings; default the similarity D = 64 and the causal
                D = 256 cases): the tensor-core kernels' speed of light, occupancy, scheduler and warp-state
                (stall reason) sections, as CSV in logs/bench/ncu.csv: where a latency-bound kernel waits
                (skipped where ncu is not on PATH; only when asked: not a step of the default list)
  models-bench  bench/models.py --device cuda: whole transformers MoE causal LMs (Mixtral, Qwen3-MoE, OLMoE, gpt-oss,
                DeepSeek-V3, DeepSeek-V3 E=256) under eager / inductor / moe: decode, prefill, a training step,
                compile times, each phase's profiler op tables (logs/bench/models-profiles/ in logs.tar.gz)
                (issue 35 item 4; one round: ~10 min, so usually its own call:
                MOE_GPU_CHECK_STEPS=models-bench MOE_GPU_CHECK_BUDGET_S=580); its models-*.md/json land in OUT

Each step has a time limit, and the whole run a budget (MOE_GPU_CHECK_BUDGET_S, default 540 s, so it fits a
10-minute call): a step that no longer fits is reported "not run (budget)" with the command that runs it.
Without a GPU the GPU steps report "skipped" and the others still run.

Results in OUT: summary.md (the table, also printed last), summary.json (machine, every step, the checks'
per-case records), bench.json/bench.md, logs.tar.gz (every step's log, the sanitizer reports).
Exit status: 0 everything ran and passed, 1 a step failed, 77 nothing failed but GPU steps were skipped.
"""

import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77
MIN_STEP_S = 20          # a step starts only with at least this much of the budget left

#===----------------------------------------------------------------------===#
# The machine
#===----------------------------------------------------------------------===#


def capture(cmd, timeout=60):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (p.stdout + p.stderr).strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable ({exc})"


def machine(python):
    info = {"nvidia_smi": capture(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                   "--format=csv,noheader"]),
            "compute_sanitizer": capture(["compute-sanitizer", "--version"]).splitlines()[-1:],
            "nvcc": capture(["nvcc", "--version"]).splitlines()[-1:]}
    probe = "\n".join([
        "import json, torch",
        "a = torch.cuda.is_available()",
        "d = {'torch': torch.__version__, 'torch_cuda': torch.version.cuda, 'gpu': a}",
        "try:",
        "    d['device'] = torch.cuda.get_device_name() if a else None",
        "    v = torch._C._cuda_getDriverVersion() if a else None",
        "    d['driver_cuda'] = f'{v // 1000}.{v % 1000 // 10}' if v else None",
        "except Exception as exc:",
        "    d['probe_note'] = repr(exc)",
        "print(json.dumps(d))"])
    out = capture([python, "-c", probe], timeout=180)
    try:
        info.update(json.loads(out.splitlines()[-1]))
    except (ValueError, IndexError):
        info.update({"gpu": False, "torch": None, "probe_error": out[-2000:]})
    return info


def version_tuple(v):
    try:
        return tuple(int(x) for x in str(v).split(".")[:2])
    except ValueError:
        return (0, 0)


#===----------------------------------------------------------------------===#
# Steps
#===----------------------------------------------------------------------===#

#: The harness cases that run the flash mixing kernels (FlashMix.cpp, FlashMma.cpp and their fused top-k and
#: attention_posterior forms), the kernels that the flash-mma options change.
FLASH_CASES = ("similarity_inform", "similarity_inform_topk_mma", "attention_posterior",
               "attention_posterior_mma", "similarity_inform_grad")
#: The moe-lower-to-nvvm options that build a variant of the flash kernels other than the default's (the 128-row
#: tensor-core kernel with up to 4 key splits, one row tile's key tiles in static shared memory, the causal blocks in
#: the balanced order): similarity_inform_grad's tensor-core passes, the 64-row kernel, the causal blocks in the
#: grid's order, the f32 mixing kernel's 3xTF32 tensor-core form, and the kernel without split keys (the only count
#: that builds other kernels: with 1 no
#: split kernel or combine is built and the key-masked cases take the lazy rescale; another count changes the host's
#: maximum alone). A folder built
#: with one gets the sanitizer steps over FLASH_CASES, so that each variant is checked by memcheck and racecheck
#: where it runs.
FLASH_VARIANT_OPTIONS = ("flash-mma-grad=true", "flash-mma-block-rows=64", "flash-causal-balance=false",
                         "flash-mma-key-splits=1", "flash-mma-tf32=true")
#: The other kernel variants behind an option (issue #46's remapped routing kernels) and the harness cases that run
#: them: a variant folder's sanitizer steps run these too (route-map=lanes keeps the picks' scores in shared memory
#: and reads them back across lanes after a warp barrier: racecheck's business).
VARIANT_CASES = {"route-map=lanes": ("route",), "topk-rounds=list": ("topk_renorm",)}



class Ctx:
    def __init__(self, out, python):
        self.out = out
        self.python = python
        # Logs and the build stay outside OUT (at most 8 files come back from a device call);
        # logs.tar.gz in OUT holds the logs, rewritten after every step.
        self.logs = tempfile.mkdtemp(prefix="moe-gpu-check-logs-")
        self.build = os.environ.get("MOE_GPU_CHECK_BUILD") or os.path.join(tempfile.gettempdir(),
                                                                            "moe-gpu-check-build")
        self.src = os.path.join(HERE, "src")
        self.art = os.path.join(HERE, "art")
        self.bench = os.path.join(HERE, "bench")
        repo = os.environ.get("MOE_REPO") or os.path.normpath(os.path.join(HERE, "..", ".."))
        self.repo = repo if os.path.exists(os.path.join(repo, "python", "moe_mlir")) else None

    def env(self, **extra):
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   # Every run may fall back to the PTX when the driver rejects the binaries.
                   MOE_CUDA_PTX_DIR=os.path.join(self.art, "gpu-cases-ptx") + ":" +
                   os.path.join(self.bench, "bench-cases-ptx"))
        env.update(extra)
        return env

    def harness(self, json_name, only=None):
        """The harness command; `only`: its case arguments (default $MOE_GPU_CHECK_ONLY)."""
        if only is None:
            only = os.environ.get("MOE_GPU_CHECK_ONLY", "")
        return [self.python, os.path.join(self.src, "test", "GPU", "run_gpu_tests.py"),
                "--lib", os.path.join(self.build, "libgpu-cases.so"), "--runtime-dir", self.build,
                "--manifest", os.path.join(self.art, "gpu-cases.manifest.json"),
                "--json", os.path.join(self.logs, json_name)] + shlex.split(only)

    def pipeline_options(self):
        """The moe-lower-to-nvvm options the check cases were built with (their manifest's pipeline_options)."""
        try:
            with open(os.path.join(self.art, "gpu-cases.manifest.json")) as f:
                return json.load(f).get("pipeline_options", "") or ""
        except (OSError, ValueError):
            return ""

    def sanitizer_only(self):
        """The sanitizer steps' case arguments: $MOE_GPU_CHECK_SANITIZE_ONLY; else the flash kernels' cases in a
        folder built with a flash-mma variant option, plus the cases of the other variant options it was built with
        (VARIANT_CASES); else the checks' ($MOE_GPU_CHECK_ONLY)."""
        if "MOE_GPU_CHECK_SANITIZE_ONLY" in os.environ:
            return os.environ["MOE_GPU_CHECK_SANITIZE_ONLY"]
        options = self.pipeline_options().split()
        cases = list(FLASH_CASES) if any(o in options for o in FLASH_VARIANT_OPTIONS) else []
        for option, variant_cases in VARIANT_CASES.items():
            if option in options:
                cases += [c for c in variant_cases if c not in cases]
        if cases:
            return "--only " + ",".join(cases)
        return os.environ.get("MOE_GPU_CHECK_ONLY", "")


def torch_args(ctx):
    """-DMOE_TORCH_DIR/-DMOE_TORCH_PYTHON for the torch extension when this Python has torch (else none; none with
    MOE_GPU_CHECK_TORCH_OPS=0, as scripts/gpu-check.sh then prebuilt no kernels)."""
    if os.environ.get("MOE_GPU_CHECK_TORCH_OPS", "1") == "0" or not os.path.isdir(os.path.join(HERE, "kernels")):
        return ""
    try:
        out = subprocess.run([ctx.python, "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    d = out.stdout.strip()
    if out.returncode != 0 or not d:
        return ""
    return f"-DMOE_TORCH_DIR={shlex.quote(d)} -DMOE_TORCH_PYTHON={shlex.quote(ctx.python)}"


def compiler_launcher():
    """ccache for the host build where there is one (the self-test here rebuilds the same sources in the same
    place on every run; the GPU machine has none)."""
    if os.environ.get("MOE_GPU_CHECK_CCACHE", "1") != "0" and shutil.which("ccache"):
        return "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
    return ""


def toolkit_root():
    """-DCUDAToolkit_ROOT=... when nvcc is not on PATH but a toolkit is where it usually is."""
    if shutil.which("nvcc"):
        return ""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "nvcc")):
            return f"-DCUDAToolkit_ROOT={shlex.quote(root)}"
    return ""


def cuda_toolkit():
    """The CUDA toolkit the kernels are compiled with: $MOE_CUDA_TOOLKIT, else ptxas's, else /usr/local/cuda."""
    ptxas = shutil.which("ptxas")
    return (os.environ.get("MOE_CUDA_TOOLKIT") or
            (os.path.dirname(os.path.dirname(os.path.realpath(ptxas))) if ptxas else "/usr/local/cuda"))


def compile_step(ctx, torch_ops_step, torch_ops):
    """torch-ops-compile: test_torch_ops_cuda.py with no prebuilt kernel, every CUDA kernel compiled on this machine
    in the test's process by $MOE_COMPILER (libmoe_compiler.so, which needs no LLVM; e.g. unzipped from the wheel's
    moe_mlir/_bundle/lib): once with the toolkit's ptxas (fatbins: cubin + PTX), once with a toolkit that has no
    bin/ (PTX alone, compiled by the driver when loaded). Each pass starts from an empty kernel cache and must fill
    it. $MOE_GPU_CHECK_COMPILE_SAMPLE: a pytest -k expression (default: every test)."""
    lib = os.environ.get("MOE_COMPILER")
    if not lib or not os.path.isfile(lib):
        return None, "no $MOE_COMPILER (libmoe_compiler.so, e.g. from the wheel's moe_mlir/_bundle/lib)"
    toolkit = cuda_toolkit()
    no_bin = os.path.join(ctx.logs, "toolkit-without-bin")
    os.makedirs(no_bin, exist_ok=True)
    for entry in os.listdir(toolkit):                    # libdevice (nvvm/), headers: all but the programs
        if entry != "bin" and not os.path.lexists(os.path.join(no_bin, entry)):
            os.symlink(os.path.join(toolkit, entry), os.path.join(no_bin, entry))
    sample = os.environ.get("MOE_GPU_CHECK_COMPILE_SAMPLE", "")
    pytest = [ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"] + \
        (["-k", sample] if sample else []) + [torch_ops]
    passes = []
    for fmt, tk in (("fatbin", toolkit), ("isa", no_bin)):
        cache = os.path.join(ctx.logs, f"kernel-cache-{fmt}")
        shutil.rmtree(cache, ignore_errors=True)
        q = shlex.quote
        passes.append(f"echo '== {fmt} ({tk})' && MOE_KERNEL_CACHE={q(cache)} MOE_CUDA_TOOLKIT={q(tk)} "
                      f"{' '.join(q(c) for c in pytest)} && n=$(find {q(cache)} -name '*.so' | wc -l) && "
                      f"echo \"{fmt}: $n kernels compiled in process\" && test \"$n\" -gt 0")
    # Both passes run whatever the first's outcome; the step fails if either does.
    script = "rc=0; " + " ".join(f"( {p} ) || rc=1;" for p in passes) + " exit $rc"
    cmd, env, *cwd = torch_ops_step(ctx, ["bash", "-c", script])
    return (cmd, env) if cmd is None else (cmd, dict(env, MOE_KERNEL_PREBUILT="", MOE_COMPILER=lib), *cwd)


def sanitizer(ctx, tool, extra):
    if not shutil.which("compute-sanitizer"):
        return None, "compute-sanitizer is not on PATH"
    cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "86", "--print-limit", "100",
           "--log-file", os.path.join(ctx.logs, f"{tool}.txt")] + extra + ctx.harness(f"{tool}-cases.json",
                                                                                       ctx.sanitizer_only())
    # Each tensor its own cudaMalloc, so that memcheck sees an access past a tensor's end.
    return cmd, ctx.env(PYTORCH_NO_CUDA_MEMORY_CACHING="1")


#: The bench cases the profile step runs under ncu (bench --only substrings): issue #47's similarity shape and its
#: causal D = 256 one, the kernel the static figures call latency-bound.
PROFILE_ONLY = "sim_B1_N16384_D64_K16_bf16,sim_B4_N4096_D256_K64_causal_bf16"
#: ncu's sections for the profile step: where the time goes (speed of light), how many warps (occupancy, launch),
#: and what they wait for (scheduler and warp state: the stall reasons).
PROFILE_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "SchedulerStats", "WarpStateStats")


#: Steps that run only when MOE_GPU_CHECK_STEPS names them (the profile's replays would take a default run's
#: budget from the checks).
ASKED_ONLY = ("profile",)


def profile(ctx, bench_cmd, env):
    """The profile step: the bench's command for one call of $MOE_GPU_PROFILE_ONLY's cases under ncu, its
    tensor-core kernels' (`_mma_`) first 8 launches, the sections' values as CSV in logs/bench/ncu.csv."""
    ncu = shutil.which("ncu")
    if not ncu:
        return None, "ncu is not on PATH"
    only = os.environ.get("MOE_GPU_PROFILE_ONLY", PROFILE_ONLY)
    sections = [a for sec in PROFILE_SECTIONS for a in ("--section", sec)]
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--kernel-name", "regex:_mma_",
           "--launch-count", "8", *sections, "--csv", "--page", "details",
           "--log-file", os.path.join(ctx.logs, "bench", "ncu.csv")]
    # The bench's own command with one repetition and no compiled baseline, its results beside the bench's.
    args = [a for a in bench_cmd if a not in ("--no-compile",)]
    out = args.index("--out")
    args[out + 1] = os.path.join(ctx.logs, "profile")
    os.makedirs(os.path.join(ctx.logs, "bench"), exist_ok=True)
    return cmd + args + ["--only", only, "--no-compile", "--reps", "1"], env


def steps(ctx):
    """[(name, needs_gpu, timeout_s, make)] where make() -> (cmd, env), (cmd, env, cwd) or (None, skip reason);
    commands run in the folder's src/ unless they name another cwd."""
    manifests = [os.path.join(ctx.art, "gpu-cases.manifest.json"),
                 os.path.join(ctx.bench, "bench-cases.manifest.json")]
    check_script = os.path.join(ctx.src, "test", "GPU", "check_artifacts.py")
    torch_ops = os.path.join(ctx.repo, "python", "tests", "test_torch_ops_cuda.py") if ctx.repo else None
    def torch_ops_step(ctx, cmd):
        """`cmd` (run in the checkout) with libmoe_torch built here and the kernels prebuilt in kernels/."""
        if not torch_ops or not os.path.exists(torch_ops):
            return None, "python/tests/test_torch_ops_cuda.py is not in the checkout around this folder (set MOE_REPO)"
        if not os.path.exists(os.path.join(ctx.build, "lib", "libmoe_torch.so")):
            if not torch_args(ctx):
                return None, ("libmoe_torch.so was not built (MOE_GPU_CHECK_TORCH_OPS=0, no kernels/, or no torch "
                              "for this Python)")
            why = "libmoe_torch.so is missing although the build step configured it"
            return ["sh", "-c", f"echo {shlex.quote(why)}; exit 1"], ctx.env()
        # In the checkout, not in src/: `python -m bench...` must import the checkout's bench package (whose
        # helpers load python/moe_mlir files by path), not src/'s copy, which holds only what the harness needs.
        return cmd, ctx.env(MOE_TEST_DEVICE="cuda", MOE_GPU_RUNTIME_DIR=ctx.build,
                            MOE_TORCH_LIB=os.path.join(ctx.build, "lib", "libmoe_torch.so"),
                            MOE_CUDA_RUNTIME=os.path.join(ctx.build, "libmoe_cuda_runtime.so"),
                            MOE_KERNEL_PREBUILT=os.path.join(HERE, "kernels"),
                            # The op verifier every torch op call runs (built here, statically linked: no LLVM there).
                            MOE_KEYS_LIBRARY=os.path.join(HERE, "lib", "libmoe_keys.so"),
                            MOE_KERNEL_CACHE=os.path.join(ctx.logs, "kernel-cache"),
                            PYTHONPATH=ctx.repo + os.pathsep + os.path.join(ctx.repo, "python") + os.pathsep +
                            os.environ.get("PYTHONPATH", "")), ctx.repo

    def bench_step(extra=()):
        """The bench's command (with `extra` arguments) and environment."""
        return ([ctx.python, "-m", "bench.gpu.bench_gpu",
                 "--lib", os.path.join(ctx.build, "libbench-cases.so"),
                 "--runtime-dir", ctx.build,
                 "--manifest", os.path.join(ctx.bench, "cases.json"),
                 "--out", os.path.join(ctx.logs, "bench")] + list(extra),
                # the route + plan cases' reference (moe_mlir.reference.routing) from the checkout's python/,
                # which src/ does not copy
                ctx.env(PYTHONPATH=os.pathsep.join(
                    [ctx.src] + ([os.path.join(ctx.repo, "python")] if ctx.repo else []))))

    return [
        ("artifacts", False, 60, lambda: (["bash", "-c", " && ".join(
            f"{shlex.quote(ctx.python)} {shlex.quote(check_script)} {shlex.quote(m)} --require-ptx"
            for m in manifests)], ctx.env())),
        # 300 s on the GPU machine's 16 cores; the self-test on two shared cores asks for more.
        ("build", False, int(os.environ.get("MOE_GPU_CHECK_BUILD_TIMEOUT_S", "300")), lambda: (["bash", "-c",
            f"cmake -S {shlex.quote(HERE)} -B {shlex.quote(ctx.build)} -DCMAKE_BUILD_TYPE=Release "
            f"-DMOE_SOURCE_DIR={shlex.quote(ctx.src)} {toolkit_root()} {compiler_launcher()} {torch_args(ctx)} && "
            f"cmake --build {shlex.quote(ctx.build)} -j {os.cpu_count() or 2}"], ctx.env())),
        ("runtime-unit", False, 60, lambda: ([os.path.join(ctx.build, "moe-cuda-runtime-fake-test")],
                                              ctx.env())),
        ("harness-unit", False, 120, lambda: ([ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                               os.path.join(ctx.src, "test", "GPU", "unit")], ctx.env())),
        ("torch-ext", False, 180, lambda: torch_ops_step(ctx, [
            ctx.python, os.path.join(ctx.src, "test", "GPU", "check", "torch_ext_check.py")])),
        ("checks", True, 300, lambda: (ctx.harness("checks-cases.json"), ctx.env())),
        ("checks-ptx", True, 300, lambda: (ctx.harness("checks-ptx-cases.json"),
                                           ctx.env(MOE_CUDA_FORCE_PTX="1"))),
        ("torch-ops", True, 300, lambda: torch_ops_step(
            ctx, [ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", torch_ops])),
        ("torch-ops-compile", True, 480, lambda: compile_step(ctx, torch_ops_step, torch_ops)),
        ("hf-models", True, 300, lambda: torch_ops_step(ctx, [
            ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-k", "matches_eager or cuda",
            os.path.join(ctx.repo, "python", "tests", "test_hf_models.py"),
            os.path.join(ctx.repo, "python", "tests", "test_grouped_mm.py")])),
        ("torch-ops-bench", True, 300, lambda: torch_ops_step(ctx, [
            ctx.python, "-m", "bench.gpu.torch_ops_cuda", "--out", os.path.join(ctx.logs, "bench")])),
        # API errors are the harness's to report (moeGpuTakeDriverError), not the sanitizer's.
        ("memcheck", True, 480, lambda: sanitizer(ctx, "memcheck", ["--report-api-errors", "no"])),
        ("racecheck", True, 480, lambda: sanitizer(ctx, "racecheck", ["--racecheck-report", "hazard"])),
        ("bench", True, 540, lambda: bench_step(shlex.split(os.environ.get("MOE_GPU_BENCH_ARGS", "")))),
        ("profile", True, 240, lambda: profile(ctx, *bench_step())),
        ("models-bench", True, 570, lambda: torch_ops_step(ctx, [
            ctx.python, "-m", "bench.models", "--device", "cuda", "--rounds", "1", "--budget", "1",
            "--results-dir", os.path.join(ctx.logs, "bench"),
            # each phase's op tables (self CPU and self device time), in logs.tar.gz: where a shortfall comes from
            "--profile-dir", os.path.join(ctx.logs, "bench", "models-profiles")] +
            # e.g. "--only deepseek_v3_e256 --phases decode prefill" when a call has less than ~10 minutes
            shlex.split(os.environ.get("MOE_GPU_MODELS_ARGS", "")))),
    ]


def run_step(ctx, name, cmd, env, timeout, cwd):
    log = os.path.join(ctx.logs, f"{name}.log")
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.flush()
        try:
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                               cwd=cwd)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        except OSError as exc:
            f.write(f"cannot run: {exc}\n")
            rc = "cannot run"
    seconds = round(time.monotonic() - t0, 1)
    tail = open(log, errors="replace").read()[-1500:]
    if rc == 0:
        status = "pass"
    elif rc == SKIP or (name == "torch-ops" and rc == 5):        # pytest: no tests collected
        status = "skipped"
    else:
        status = "fail"
    rec = {"step": name, "status": status, "rc": rc, "seconds": seconds, "log": f"logs/{name}.log",
           "tail": tail}
    if status == "skipped":                                      # the program says why
        rec["reason"] = ([l for l in tail.splitlines() if l.strip()] or [""])[-1][:200]
    return rec


#===----------------------------------------------------------------------===#
# Main
#===----------------------------------------------------------------------===#


def summary_md(doc):
    m = doc["machine"]
    lines = [f"# GPU check {doc['date']}", "",
             f"artifacts: commit {doc['artifacts'].get('commit')}, built {doc['artifacts'].get('built')}, "
             f"toolkit {doc['artifacts'].get('toolkit')}", "",
             f"machine: {m.get('device') or 'no GPU'}; driver CUDA {m.get('driver_cuda')}; "
             f"torch {m.get('torch')} (CUDA {m.get('torch_cuda')}); {m.get('nvidia_smi')}", "",
             "| step | status | seconds | note |", "|---|---|---|---|"]
    for s in doc["steps"]:
        note = s.get("reason") or ""
        if s["status"] == "fail":
            last = [l for l in s.get("tail", "").splitlines() if l.strip()][-1:]
            note = f"rc {s['rc']}: {last[0][:150] if last else ''}"
        lines.append(f"| {s['step']} | {s['status']} | {s.get('seconds', '')} | {note} |")
    lines += ["", doc["verdict"]]
    return "\n".join(lines) + "\n"


def main(argv):
    out = os.path.abspath(argv[1] if len(argv) > 1 else os.environ.get("OUT") or "gpu-check-results")
    os.makedirs(out, exist_ok=True)
    python = os.environ.get("MOE_PYTHON") or shutil.which("python3") or sys.executable
    ctx = Ctx(out, python)
    budget = float(os.environ.get("MOE_GPU_CHECK_BUDGET_S", "540"))
    wanted = [s for s in os.environ.get("MOE_GPU_CHECK_STEPS", "").split(",") if s]
    t_start = time.monotonic()
    info = machine(python)
    artifacts = json.load(open(os.path.join(HERE, "MANIFEST.json")))
    gpu = bool(info.get("gpu"))
    print(f"gpu-check: {info.get('device') or 'no GPU visible to PyTorch'}; torch {info.get('torch')}; "
          f"artifacts {artifacts.get('commit')}", flush=True)
    need = artifacts.get("binary_needs_cuda")
    if gpu and info.get("driver_cuda") and version_tuple(info["driver_cuda"]) < version_tuple(need):
        print(f"gpu-check: the driver supports CUDA {info['driver_cuda']}, the binaries need {need}: "
              f"the runtime will JIT the PTX fallback", flush=True)
    all_steps = steps(ctx)
    unknown = [w for w in wanted if w not in [s[0] for s in all_steps]]
    if unknown:
        print(f"gpu-check: unknown step(s) {unknown}; steps: {[s[0] for s in all_steps]}")
        return 2
    results = []
    failed_build = False
    for name, needs_gpu, timeout, make in all_steps:
        if wanted and name not in wanted and name not in ("artifacts", "build"):
            continue                         # the host side is always (re)built: cheap, and needed
        if not wanted and name in ASKED_ONLY:
            continue
        rec = {"step": name}
        left = budget - (time.monotonic() - t_start)
        if needs_gpu and not gpu:
            rec.update(status="skipped", reason="no CUDA device visible to PyTorch")
        elif failed_build and name not in ("artifacts", "harness-unit"):
            rec.update(status="not run", reason="the build failed")
        elif left < MIN_STEP_S:
            rec.update(status="not run",
                       reason=f"budget (run again with MOE_GPU_CHECK_STEPS={name})")
        else:
            made = make()
            cmd, env = made[:2]
            cwd = made[2] if len(made) > 2 else ctx.src
            if cmd is None:
                rec.update(status="skipped", reason=env)
            else:
                print(f"gpu-check: {name} ...", flush=True)
                rec = run_step(ctx, name, cmd, env, min(timeout, left), cwd)
                if rec["rc"] == "timeout" and timeout > left:
                    # Cut by the budget, not by its own limit: not a failure, but not a pass either.
                    rec.update(status="not run",
                               reason=f"stopped at the budget (run again with MOE_GPU_CHECK_STEPS={name})")
        if name == "build" and rec["status"] == "fail":
            failed_build = True
        cases = os.path.join(ctx.logs, f"{name}-cases.json")
        if os.path.exists(cases):
            rec["cases"] = json.load(open(cases)).get("cases")
        results.append(rec)
        print(f"gpu-check: {name}: {rec['status']} {rec.get('reason', '')}", flush=True)
        write_results(ctx, info, artifacts, results, gpu, final=False)
    md, rc = write_results(ctx, info, artifacts, results, gpu, final=True)
    shutil.rmtree(ctx.logs, ignore_errors=True)
    print(md)
    return rc


def write_results(ctx, info, artifacts, results, gpu, final):
    """summary.json, summary.md, bench.json/.md and logs.tar.gz in OUT (also after every step, so that a run
    stopped from outside leaves what it did)."""
    out = ctx.out
    failed = [r["step"] for r in results if r["status"] == "fail"]
    not_run = [r["step"] for r in results if r["status"] in ("skipped", "not run")]
    if failed:
        verdict, rc = f"FAILED: {', '.join(failed)}", 1
    elif not gpu:
        verdict, rc = "SKIPPED: no CUDA device visible to PyTorch (the GPU-free steps passed)", SKIP
    elif not_run:
        verdict, rc = f"PASSED, but not run: {', '.join(not_run)}", SKIP
    else:
        verdict, rc = "PASSED: every step", 0
    if not final:
        verdict = "INCOMPLETE (still running or stopped): " + verdict
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": info, "artifacts": {k: artifacts.get(k) for k in ("commit", "built", "toolkit", "chip")},
           "steps": results, "verdict": verdict}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(doc, f, indent=1)
    md = summary_md(doc)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(md)
    bench_dir = os.path.join(ctx.logs, "bench")
    if os.path.isdir(bench_dir):
        for fn in sorted(os.listdir(bench_dir)):
            if fn.startswith("gpu-") and fn.endswith((".json", ".md")):
                shutil.copy(os.path.join(bench_dir, fn), os.path.join(out, "bench" + os.path.splitext(fn)[1]))
            elif fn.startswith("models-") and fn.endswith((".json", ".md")):
                shutil.copy(os.path.join(bench_dir, fn), os.path.join(out, fn))
    with tarfile.open(os.path.join(out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(ctx.logs, arcname="logs")
    return md, rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
