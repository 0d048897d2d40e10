"""The installable wheel (scripts/build-wheel.sh, docs/Install.md) in a fresh venv outside the source tree.

The wheel is built from the build tree when ``dist/`` has none newer than its inputs (CI runs scripts/test.sh on a
clean clone, never the set-up that builds it). The venv is new, made without the project venv's site-packages, and
the wheel is installed with ``--no-deps``; torch and transformers come from the project venv through a ``.pth``
line naming its site-packages directory: a plain path entry, so that the ``.pth`` files there (the editable
install's finder, which maps ``moe_mlir`` to the source tree) are not run. The smoke test runs there, from a
temporary directory, without ``PYTHONPATH`` or any ``MOE_*`` variable, with an empty kernel cache, and with the
system's LLVM/MLIR, the CUDA toolkit's tools and every compiler out of reach (a private mount namespace hides
/usr/lib/llvm-22 and /usr/local/cuda/bin; PATH holds the venv alone). It compiles and runs every kernel family of the
torch ops in process, builds one CUDA kernel, and asserts that everything comes from the installed package:
``moe_mlir`` itself, moe-opt, the extension, the compiler and the kernel runtime (``/proc/self/maps``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "dist"


def _build_dir() -> Path:
    d = Path(os.environ.get("MOE_BUILD_DIR") or "build")
    return d if d.is_absolute() else ROOT / d


def _wheel_inputs(build: Path) -> list[Path]:
    """What the wheel is made of: a newer one of these makes dist/'s wheel stale."""
    py = ROOT / "python"
    files = [build / "bin" / "moe-opt-static", *(build / "lib").glob("*.so"), py / "pyproject.toml", py / "setup.py",
             py / "_moe_mlir_cli.py", ROOT / "scripts" / "build-wheel.sh", ROOT / "scripts" / "wheel_system_deps.py",
             ROOT / "tools" / "moe-aot" / "moe-aot.py"]
    return files + sorted((py / "moe_mlir").rglob("*.py"))


@pytest.fixture(scope="module")
def wheel(moe_opt, tmp_path_factory) -> Path:
    """A copy of dist/'s wheel, built now unless one is newer than every input. scripts/build-wheel.sh replaces the
    wheel under dist/.build.lock, and the copy is taken under the same lock: another run's (or the set-up's) rebuild
    cannot remove it while it is read or installed."""
    build = _build_dir()
    DIST.mkdir(exist_ok=True)
    newest_input = max(p.stat().st_mtime for p in _wheel_inputs(build) if p.exists())
    current = sorted(DIST.glob("moe_mlir-*.whl"))
    if len(current) != 1 or current[0].stat().st_mtime < newest_input:
        proc = subprocess.run([str(ROOT / "scripts" / "build-wheel.sh")], capture_output=True, text=True,
                              env={**os.environ, "MOE_BUILD_DIR": str(build)}, timeout=600)
        assert proc.returncode == 0, f"scripts/build-wheel.sh failed:\n{proc.stdout}\n{proc.stderr}"
    with open(DIST / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheels = sorted(DIST.glob("moe_mlir-*.whl"))
        assert len(wheels) == 1, wheels
        copy = tmp_path_factory.mktemp("dist") / wheels[0].name
        shutil.copyfile(wheels[0], copy)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert re.fullmatch(rf"moe_mlir-[^-]+-{tag}-{tag}-manylinux_2_\d+_x86_64\.whl", copy.name), copy.name
    return copy


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A new venv with the wheel installed and the project venv's torch and transformers reachable."""
    v = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(v)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(v / "bin" / "python"),
                    "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=300)
    import transformers

    deps = {str(Path(m.__file__).resolve().parents[1]) for m in (torch, transformers)}
    purelib = _run(v, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    assert Path(purelib).resolve().is_relative_to(v.resolve())
    (Path(purelib) / "project_venv_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    return v


def _version() -> str:
    """The release written in moe_mlir/_version.py (the one place: pyproject and moe-opt read it)."""
    text = (ROOT / "python" / "moe_mlir" / "_version.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOE_") and k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "MOE_KERNEL_CACHE": str(tmp / "kernels"), "HF_HUB_OFFLINE": "1"}


def _run(v: Path, *args: str, exe: str = "python", cwd: Path | None = None,
         env: dict | None = None) -> subprocess.CompletedProcess:
    cwd = cwd or v.parent
    return subprocess.run([str(v / "bin" / exe), *args], cwd=cwd, env=env or _env(cwd), capture_output=True,
                          text=True, timeout=600)


SMOKE = r'''
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

venv, root = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
# Out of reach: the system's LLVM/MLIR (an empty directory mounted over /usr/lib/llvm-22), the CUDA toolkit's tools,
# and every compiler (PATH holds the venv's bin/ alone).
assert not os.path.exists("/usr/lib/llvm-22") or not os.listdir("/usr/lib/llvm-22"), os.listdir("/usr/lib/llvm-22")
assert not os.path.exists("/usr/local/cuda/bin/ptxas")
tools = ("clang", "clang-22", "cc", "gcc", "c++", "g++", "ld", "mlir-translate", "llc", "ptxas", "nvcc")
assert not [t for t in tools if shutil.which(t)], [shutil.which(t) for t in tools]

import torch
import moe_mlir
from moe_mlir.runtime import cache, driver, extension, keys, locate, prebuild

inside = lambda p, d: Path(p).resolve().is_relative_to(d)
assert inside(moe_mlir.__file__, venv), moe_mlir.__file__
# The source tree's package is not reachable (the project venv, torch's home, may lie inside the checkout).
assert not [p for p in sys.path if inside(p or ".", root / "python") or Path(p or ".").resolve() == root], sys.path
bundle = locate.bundle_dir()
assert bundle is not None and inside(bundle, venv), bundle
assert inside(locate.find_moe_opt(), bundle), locate.find_moe_opt()
assert extension.library_path and inside(extension.library_path, bundle), extension.library_path
assert inside(locate.find_moe_aot(), bundle), locate.find_moe_aot()  # the GPU whole-graph build's script


def refuse(*a, **k):
    raise AssertionError(f"a process was started: {a[:2]}")


# Every kernel family of torch.ops.moe compiled now (the cache is empty) in this process, by the bundled compiler
# (its lld links them), with no way to start a process, and run: forward and backward.
saved = subprocess.Popen.__init__, os.fork, os.posix_spawn, os.posix_spawnp, os.system
subprocess.Popen.__init__ = refuse
os.fork = os.posix_spawn = os.posix_spawnp = os.system = refuse
x = torch.randn(37, 16, generator=torch.Generator().manual_seed(0))
w, i = torch.ops.moe.topk_renorm(x, 4)
ref_w, ref_i = torch.softmax(x, -1).topk(4, dim=-1)
assert torch.equal(i.long(), ref_i), (i, ref_i)
torch.testing.assert_close(w, ref_w / ref_w.sum(-1, keepdim=True))
prebuild.run_calls(list(prebuild.COMMON_CALLS))
from moe_mlir.ops import balance, capacity

g = torch.Generator().manual_seed(2)
logits = torch.randn(6, 8, generator=g, requires_grad=True)
(balance.load_balancing_loss(logits, 2) + balance.router_z_loss(logits)).backward()
s = torch.softmax(torch.randn(2, 3, 8, generator=g), -1).requires_grad_()
w, i = torch.ops.moe.topk_renorm(s.detach(), 2)
balance.sequence_balance_loss(s, i.long(), 2).backward()
x = torch.randn(6, 8, generator=g, requires_grad=True)
w, i = torch.ops.moe.topk_renorm(x, 2)
w.sum().backward()
w, i = torch.ops.moe.route(x, torch.zeros(8), 2, "sigmoid", "score_then_topk", 1, 1, "top2_sum", True, 1.0)
w.sum().backward()
capacity.apply_capacity(i, w.detach(), 8, 2)
capacity.bias_update(torch.zeros(8), torch.bincount(i.flatten().long(), minlength=8).float(), 0.01)
torch.ops.moe.similarity_inform(torch.randn(1, 3, 16, generator=g), torch.softmax(torch.randn(1, 3, 4, generator=g), -1),
                                None, None, 1.0, False)
B, H, N, D, Dh, K = 1, 2, 3, 8, 4, 4
post = [t.requires_grad_() for t in (torch.randn(B, H, N, N, generator=g), torch.randn(B, N, D, generator=g),
                                     torch.randn(B, H, N, Dh, generator=g), torch.randn(D, H * Dh, generator=g),
                                     torch.softmax(torch.randn(B, N, K, generator=g), -1))]
torch.ops.moe.attention_posterior(*post, 1.0, "min_entropy", None)[0].sum().backward()
E, D, De, Dh = 2, 4, 8, 8
hyper = [torch.randn(*shape, generator=g).requires_grad_() for shape in ((De,), (Dh, De), (Dh,), (E * (D + 1), Dh),
                                                                         (E * (D + 1),))]
out = torch.ops.moe.hyper_router(*hyper, E)
(out[0] if isinstance(out, (tuple, list)) else out).sum().backward()
families = {k.split("|")[0] for k in cache.stats.keys}
assert families == set(keys.key_ops()), sorted(set(keys.key_ops()) - families)
assert cache.stats.compiles == len(set(cache.stats.keys)), cache.stats

# One CUDA kernel built (no GPU needed): without the toolkit's ptxas, PTX that the driver compiles at load.
assert driver.cuda_binary_format() == "isa"
k = cache.parse_key("topk_renorm|k=8|mode=logits|renormalize=1|in:scores:f32:?x256|device=cuda:0")
so = Path("cuda-kernel.so").resolve()
cuda_rt = locate.find_runtime_lib("libmoe_cuda_runtime.so")
assert cuda_rt and inside(cuda_rt, bundle), cuda_rt
driver.build_cuda_kernel(cache.kernel_module(k), so, cuda_rt, "sm_90")
data = so.read_bytes()
assert data[:4] == b"\x7fELF" and b"_mlir_ciface_kernel" in data and b"libmoe_cuda_runtime.so" in data, len(data)
assert b".target sm_90" in data and b".entry" in data, "no PTX embedded"
subprocess.Popen.__init__, os.fork, os.posix_spawn, os.posix_spawnp, os.system = saved

# torch.compile(backend="moe") of HF's Qwen3-MoE block: the router raised to moe.topk_renorm, equal to eager. The
# dense part runs eagerly (inductor's CPU code needs a C++ compiler, which this machine does not have).
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
from moe_mlir.backends.dynamo import capture_graphs

cfg = Qwen3MoeConfig(hidden_size=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                     norm_topk_prob=True)
block = Qwen3MoeSparseMoeBlock(cfg).eval()
g = torch.Generator().manual_seed(1)
with torch.no_grad():
    for p in block.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.3)
compiled = torch.compile(block, backend="moe", options={"dense": "eager"})
with capture_graphs() as log, torch.no_grad():
    for t in (5, 12):
        x = torch.randn(2, t, 32, generator=g)
        got, want = compiled(x), block(x)
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
assert sum(gr.counts.get("topk_renorm", 0) for gr in log) >= 1, [gr.counts for gr in log]

# The whole-graph path (the bundled moe-opt, then the execution API in libmoe_compiler.so) on a seed block.
from moe_mlir.models import similarity_inform

model, (x,) = similarity_inform.example(batch=2, seq=8)
whole = moe_mlir.compile(model, (x,), backend="executor")
with torch.no_grad():
    want = model(x)
got = whole(x)
first = lambda out: out[0] if isinstance(out, (tuple, list)) else out
torch.testing.assert_close(first(got), first(want), rtol=1e-4, atol=1e-5)

# Every library of ours in the process (the extension, the compiler, the kernel runtime) is the bundle's, and
# nothing of a system LLVM is loaded.
maps = open("/proc/self/maps").read().splitlines()
ours = {line.split()[-1] for line in maps if re.search(r"libmoe_|libMoE", line)}
assert {Path(p).name for p in ours} >= {"libmoe_torch.so", "libmoe_kernel_runtime.so", "libmoe_compiler.so"}, ours
assert all(inside(p, bundle) for p in ours), ours
assert not [l for l in maps if re.search(r"libLLVM|libMLIR|llvm-22", l)]
print("smoke ok", moe_mlir.__version__)
'''


def _out_of_reach(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Runs the venv's python with ``args`` where the system's LLVM (/usr/lib/llvm-22) and the CUDA toolkit's tools
    (/usr/local/cuda/bin: ptxas, nvcc; its libraries stay, torch's CUDA build loads them) are empty directories (a private mount namespace: ``unshare``, as an unprivileged user too)
    and PATH holds the venv's bin/ alone."""
    hide = [d for d in ("/usr/lib/llvm-22", "/usr/local/cuda/bin") if os.path.isdir(d)]
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    assert unshare and mount, "util-linux's unshare and mount are needed to hide the system's LLVM"
    mounts = " && ".join(f"{mount} -t tmpfs none {d}" for d in hide) or "true"
    env = {**_env(cwd), "PATH": str(venv / "bin")}
    cmd = [unshare, "--map-root-user", "--mount", "/bin/sh", "-c", f'{mounts} && exec "$0" "$@"',
           str(venv / "bin" / "python"), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_wheel_smoke_in_fresh_venv(venv: Path, tmp_path: Path):
    proc = _out_of_reach(venv, "-c", SMOKE, str(venv), str(ROOT), cwd=tmp_path)  # an empty kernel cache in tmp_path
    assert proc.returncode == 0, f"smoke test failed in {venv}:\n{proc.stdout}\n{proc.stderr[-6000:]}"
    version = _version()
    assert f"smoke ok {version}" in proc.stdout
    # No warning the user did not cause (the eager-fallback RuntimeWarning, a missing-kernel warning...).
    assert "Warning" not in proc.stderr, proc.stderr[-4000:]


def test_wheel_is_self_contained_and_its_tag_matches(wheel: Path):
    """No piece of the wheel links a shared LLVM, MLIR or clang, and auditwheel finds the manylinux tag of its name
    to be the one its pieces' C library symbols need (and no library outside the policy)."""
    import zipfile

    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        z.extractall(tmp)
        elves = [p for p in Path(tmp).rglob("*") if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
        assert {p.name for p in elves} >= {"moe-opt", "libmoe_compiler.so", "libmoe_torch.so"}, elves
        for p in elves:
            dyn = subprocess.run(["readelf", "-d", str(p)], capture_output=True, text=True).stdout
            assert not re.search(r"NEEDED.*lib(LLVM|MLIR|clang)", dyn), (p.name, dyn)
            assert "llvm-22" not in dyn, (p.name, dyn)
    # The OpenMP runtime the extension links is torch's (its run path), which auditwheel finds only when told:
    # this system's (GCC 12's libgomp) needs glibc 2.34, torch's 2.17.
    torch_lib = Path(torch.__file__).parent / "lib"
    with tempfile.TemporaryDirectory() as gomp:
        if (torch_lib / "libgomp.so.1").exists():
            (Path(gomp) / "libgomp.so.1").symlink_to(torch_lib / "libgomp.so.1")
        show = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)], capture_output=True,
                              text=True, timeout=600, env={**os.environ, "LD_LIBRARY_PATH": gomp})
    assert show.returncode == 0, show.stderr
    audit = json.loads(show.stdout)
    tag = re.search(r"-(manylinux_2_\d+_x86_64)\.whl$", wheel.name).group(1)
    assert audit["sym_tag"] == tag, audit["sym_tag"]
    # Outside the manylinux policy, only what torch ships (its wheel is a dependency) and the GPU driver: what
    # `auditwheel repair --exclude` leaves to them, as every torch extension's wheel does.
    external = set(audit["external_libs"])
    assert external <= {p.name for p in torch_lib.iterdir()} | {"libcuda.so.1", "libgomp.so.1"}, external


def test_pieces_run_on_glibc_2_31(wheel: Path, tmp_path: Path):
    """The wheel installs where glibc is 2.31 (Ubuntu 20.04 and 22.04, RHEL/Rocky 9, Amazon Linux 2023): its tag is
    manylinux_2_31 or older, and under glibc 2.31's own loader, with 2.31's C library and GCC 10's libstdc++ and
    libgcc_s (scripts/glibc-sysroot.sh: Debian 11's packages) before anything of this system, every piece's symbol
    versions resolve (torch's libraries beside them) and the bundled moe-opt lowers a routing function to LLVM."""
    import zipfile

    tag = int(re.search(r"-manylinux_2_(\d+)_x86_64\.whl$", wheel.name).group(1))
    assert tag <= 31, wheel.name
    made = subprocess.run([str(ROOT / "scripts" / "glibc-sysroot.sh")], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    sysroot = Path(made.stdout.strip())
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path)
    bundle = tmp_path / "moe_mlir" / "_bundle"
    loader = sysroot / "lib64" / "ld-linux-x86-64.so.2"
    path = ":".join(str(p) for p in [sysroot / "lib" / "x86_64-linux-gnu", sysroot / "usr" / "lib" / "x86_64-linux-gnu",
                                     bundle / "lib", Path(torch.__file__).parent / "lib"])
    moe_opt = bundle / "bin" / "moe-opt"
    moe_opt.chmod(0o755)
    # Not the CUDA runtime, which needs the GPU driver's libcuda.so.1 (its glibc versions are in the tag, which
    # build-wheel.sh takes from every piece's symbols, auditwheel agreeing: the test above).
    pieces = [p for p in [moe_opt, *sorted((bundle / "lib").glob("*.so"))] if p.name != "libmoe_cuda_runtime.so"]
    for piece in pieces:
        listed = subprocess.run([str(loader), "--library-path", path, "--list", str(piece)], capture_output=True,
                                text=True, timeout=120)
        assert listed.returncode == 0 and "not found" not in listed.stdout + listed.stderr, (piece.name, listed)
        assert f"{sysroot}/lib/x86_64-linux-gnu/libc.so.6" in listed.stdout, (piece.name, listed.stdout)
    text = """
func.func @f(%x: tensor<3x5xf32>) -> tensor<3x2xf32> {
  %w, %i = moe.topk_renorm %x k(2) : tensor<3x5xf32> -> tensor<3x2xf32>, tensor<3x2xi32>
  return %w : tensor<3x2xf32>
}
"""
    lowered = subprocess.run([str(loader), "--library-path", path, str(moe_opt), "--moe-lower-to-llvm", "-"],
                             input=text, capture_output=True, text=True, timeout=300)
    assert lowered.returncode == 0, lowered.stderr
    assert "llvm.func @f" in lowered.stdout and "moe." not in lowered.stdout, lowered.stdout[-2000:]


def test_moe_opt_console_script(venv: Path):
    version = _version()
    meta = _run(venv, "-c", "import importlib.metadata as m; print(m.version('moe_mlir'))")
    assert meta.stdout.strip() == version, meta
    proc = _run(venv, "--version", exe="moe-opt")
    assert proc.returncode == 0, proc.stderr
    assert f"MoE-MLIR version {version}" in proc.stdout and "LLVM version 22" in proc.stdout, proc.stdout
    # It is moe-opt with the dialect and its passes: the portable lowering leaves no moe op.
    text = """
func.func @f(%x: tensor<3x5xf32>) -> tensor<3x2xf32> {
  %w, %i = moe.topk_renorm %x k(2) : tensor<3x5xf32> -> tensor<3x2xf32>, tensor<3x2xi32>
  return %w : tensor<3x2xf32>
}
"""
    lowered = subprocess.run([str(venv / "bin" / "moe-opt"), "--convert-moe-to-linalg", "-"], input=text,
                             capture_output=True, text=True, env=_env(venv.parent), cwd=venv.parent, timeout=120)
    assert lowered.returncode == 0, lowered.stderr
    assert "moe." not in lowered.stdout and "linalg.generic" in lowered.stdout, lowered.stdout
    # The console script starts moe-opt without importing the package (and torch).
    probe = _run(venv, "-c", "import sys, _moe_mlir_cli; loc = _moe_mlir_cli._locate(); "
                 "print(loc.find_moe_opt(search_path=False)); "
                 "assert 'torch' not in sys.modules and 'moe_mlir' not in sys.modules, sorted(sys.modules)")
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).resolve().is_relative_to(venv.resolve()), probe.stdout


def _system_json(venv: Path) -> Path:
    (path,) = venv.glob("lib/python*/site-packages/moe_mlir/_bundle/system.json")
    return path


def test_system_requirements_are_empty(venv: Path):
    """The bundle needs nothing of the system beyond the C and C++ run-time libraries its manylinux tag promises: no
    LLVM/MLIR library, no tool (torch's libraries come with torch, ours with the bundle)."""
    assert json.loads(_system_json(venv).read_text()) == []


def test_missing_system_package_is_named_at_import(venv: Path):
    """A machine without a library the bundle needs: `import moe_mlir` and `moe-opt` fail naming the package."""
    path = _system_json(venv)
    original = path.read_text()
    gone = {"what": "libMLIR.so.22.1", "package": "libmlir-22", "needed_by": ["moe-opt"],
            "paths": [str(venv.parent / "no-such-dir" / "libMLIR.so.22.1")]}
    path.write_text(json.dumps([gone]))
    try:
        imp = _run(venv, "-c", "import moe_mlir")
        assert imp.returncode != 0
        assert "MissingSystemPackages: moe_mlir needs libmlir-22" in imp.stderr, imp.stderr[-3000:]
        assert "apt install libmlir-22" in imp.stderr, imp.stderr[-3000:]
        tool = _run(venv, "--version", exe="moe-opt")
        assert tool.returncode == 1 and "moe_mlir needs libmlir-22" in tool.stderr, tool
    finally:
        path.write_text(original)
