"""Unit tests of the GPU check's driver (test/GPU/check/gpu_check.py), no GPU needed: the verdict and exit
status from the steps' results, GPU steps skipped without a GPU, the time budget, step selection, and the files
it leaves in OUT."""

import importlib.util
import json
import os
import sys
import tarfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(HERE, "..", "check", "gpu_check.py"))
G = importlib.util.module_from_spec(spec)
spec.loader.exec_module(G)


def fake_steps(codes, gpu_steps=("gpu-a",), sleep=None):
    def make(rc):
        code = f"import time; time.sleep({sleep})\n" if sleep else ""
        return lambda: ([sys.executable, "-c", code + f"print('step output'); raise SystemExit({rc})"], None)
    return lambda ctx: [(name, name in gpu_steps, 60, make(rc)) for name, rc in codes]


@pytest.fixture
def setup(tmp_path, monkeypatch):
    folder = tmp_path / "folder"
    (folder / "src").mkdir(parents=True)
    (folder / "MANIFEST.json").write_text(json.dumps({"commit": "abc", "binary_needs_cuda": "13.0"}))
    monkeypatch.setattr(G, "HERE", str(folder))
    monkeypatch.delenv("MOE_GPU_CHECK_STEPS", raising=False)
    monkeypatch.delenv("MOE_GPU_CHECK_BUDGET_S", raising=False)

    def run(codes, gpu=True, **kw):
        monkeypatch.setattr(G, "machine", lambda py: {"gpu": gpu, "device": "Fake H200" if gpu else None})
        monkeypatch.setattr(G, "steps", fake_steps(codes, **kw))
        out = tmp_path / "out"
        rc = G.main(["gpu_check.py", str(out)])
        return rc, json.loads((out / "summary.json").read_text()), out
    return run


def statuses(doc):
    return {s["step"]: s["status"] for s in doc["steps"]}


def test_all_pass_is_0_and_leaves_five_files_at_most(setup):
    rc, doc, out = setup([("build", 0), ("gpu-a", 0)])
    assert rc == 0 and doc["verdict"] == "PASSED: every step"
    assert sorted(os.listdir(out)) == ["logs.tar.gz", "summary.json", "summary.md"]
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert "logs/gpu-a.log" in tar.getnames()


def test_a_failing_step_is_1_and_named(setup):
    rc, doc, _ = setup([("build", 0), ("gpu-a", 3)])
    assert rc == 1 and doc["verdict"] == "FAILED: gpu-a"
    assert "step output" in doc["steps"][1]["tail"]


def test_skip_code_is_skipped_not_passed(setup):
    rc, doc, _ = setup([("build", 0), ("gpu-a", 77)])
    assert rc == 77 and statuses(doc)["gpu-a"] == "skipped"


def test_without_gpu_gpu_steps_are_skipped(setup):
    rc, doc, _ = setup([("build", 0), ("gpu-a", 0)], gpu=False)
    assert rc == 77 and statuses(doc) == {"build": "pass", "gpu-a": "skipped"}
    assert doc["verdict"].startswith("SKIPPED")


def test_build_failure_stops_the_steps_that_need_it(setup):
    rc, doc, _ = setup([("build", 1), ("gpu-a", 0)])
    assert rc == 1 and statuses(doc) == {"build": "fail", "gpu-a": "not run"}


def test_budget(setup, monkeypatch):
    monkeypatch.setenv("MOE_GPU_CHECK_BUDGET_S", "10")
    rc, doc, _ = setup([("build", 0), ("gpu-a", 0)], sleep=0)
    assert rc == 77 and statuses(doc)["build"] == "not run"           # less than 20 s left: nothing starts
    assert "MOE_GPU_CHECK_STEPS=build" in doc["steps"][0]["reason"]


def test_step_selection_keeps_the_build(setup, monkeypatch):
    monkeypatch.setenv("MOE_GPU_CHECK_STEPS", "gpu-b")
    rc, doc, _ = setup([("build", 0), ("gpu-a", 0), ("gpu-b", 0)], gpu_steps=("gpu-a", "gpu-b"))
    assert rc == 0 and list(statuses(doc)) == ["build", "gpu-b"]


def test_unknown_step_is_2(setup, monkeypatch, tmp_path):
    monkeypatch.setenv("MOE_GPU_CHECK_STEPS", "nope")
    monkeypatch.setattr(G, "machine", lambda py: {"gpu": True})
    monkeypatch.setattr(G, "steps", fake_steps([("build", 0)]))
    assert G.main(["gpu_check.py", str(tmp_path / "out")]) == 2


def test_a_step_cut_by_the_budget_is_not_run_not_failed(setup, monkeypatch):
    monkeypatch.setattr(G, "MIN_STEP_S", 1)
    monkeypatch.setenv("MOE_GPU_CHECK_BUDGET_S", "2.5")       # the step starts, then the budget ends it
    rc, doc, _ = setup([("gpu-a", 0)], sleep=30)
    step = doc["steps"][0]
    assert (rc, step["status"], step["rc"]) == (77, "not run", "timeout")
    assert "stopped at the budget" in step["reason"]


def test_a_step_past_its_own_limit_fails(setup, monkeypatch):
    def steps(ctx):
        return [("gpu-a", True, 1, lambda: ([sys.executable, "-c", "import time; time.sleep(30)"], None))]
    monkeypatch.setattr(G, "machine", lambda py: {"gpu": True})
    monkeypatch.setattr(G, "steps", steps)
    out = os.path.join(G.HERE, "..", "out2")
    assert G.main(["gpu_check.py", out]) == 1
    assert json.loads(open(os.path.join(out, "summary.json")).read())["steps"][0]["status"] == "fail"


def sanitizer_commands(folder, options, monkeypatch, **env):
    """The memcheck and racecheck commands of a folder whose check cases were built with `options`."""
    (folder / "art").mkdir(exist_ok=True)
    (folder / "art" / "gpu-cases.manifest.json").write_text(json.dumps({"pipeline_options": options}))
    monkeypatch.setattr(G.shutil, "which", lambda name: "/usr/bin/" + name)
    for k in ("MOE_GPU_CHECK_ONLY", "MOE_GPU_CHECK_SANITIZE_ONLY"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ctx = G.Ctx(str(folder / "out"), sys.executable)
    made = {name: make() for name, _, _, make in G.steps(ctx) if name in ("checks", "memcheck", "racecheck")}
    checks = made["checks"][0]
    return checks, [made[t][0] for t in ("memcheck", "racecheck")]


def test_sanitizers_run_every_check_of_the_default_folder(setup, tmp_path, monkeypatch):
    # The flash kernel's defaults spelled out build no variant: every case still runs under the sanitizers.
    checks, sanitized = sanitizer_commands(tmp_path / "folder", "balance-kernels=true flash-mma-block-rows=128 "
                                           "flash-mma-key-splits=4", monkeypatch)
    for cmd in sanitized:
        assert cmd[0] == "compute-sanitizer" and "--only" not in cmd
        assert cmd[cmd.index("--lib"):cmd.index("--json")] == checks[checks.index("--lib"):checks.index("--json")]


@pytest.mark.parametrize("option", G.FLASH_VARIANT_OPTIONS)
def test_sanitizers_run_the_flash_cases_of_a_variant_folder(setup, tmp_path, monkeypatch, option):
    # The second folder of test/GPU/README.md (built with a flash-mma variant option): memcheck and racecheck
    # over the flash kernels' cases, which every variant runs in; the checks keep every case.
    checks, sanitized = sanitizer_commands(tmp_path / "folder", "balance-kernels=true " + option, monkeypatch)
    assert "--only" not in checks
    for cmd in sanitized:
        assert cmd[cmd.index("--only") + 1].split(",") == list(G.FLASH_CASES)


@pytest.mark.parametrize("options,cases", [
    ("route-map=lanes", ["route"]),
    ("topk-rounds=list route-map=lanes", ["route", "topk_renorm"]),
    ("flash-mma-grad=true route-map=lanes", list(G.FLASH_CASES) + ["route"])])
def test_sanitizers_run_the_cases_of_the_routing_variants(setup, tmp_path, monkeypatch, options, cases):
    # A folder built with issue #46's remapped routing kernels: memcheck and racecheck over their ops' cases (with
    # the flash cases where a flash variant is on too); the checks keep every case.
    checks, sanitized = sanitizer_commands(tmp_path / "folder", "balance-kernels=true " + options, monkeypatch)
    assert "--only" not in checks
    for cmd in sanitized:
        assert sorted(cmd[cmd.index("--only") + 1].split(",")) == sorted(cases)


def test_sanitizer_cases_can_be_named(setup, tmp_path, monkeypatch):
    _, sanitized = sanitizer_commands(tmp_path / "folder", "flash-mma-grad=true", monkeypatch,
                                      MOE_GPU_CHECK_SANITIZE_ONLY="--only similarity_inform")
    assert all(cmd[-2:] == ["--only", "similarity_inform"] for cmd in sanitized)
    _, sanitized = sanitizer_commands(tmp_path / "folder", "", monkeypatch, MOE_GPU_CHECK_ONLY="--only balance")
    assert all(cmd[-2:] == ["--only", "balance"] for cmd in sanitized)


def test_flash_cases_are_harness_cases():
    spec = importlib.util.spec_from_file_location("run_gpu_tests", os.path.join(HERE, "..", "run_gpu_tests.py"))
    text = open(spec.origin).read()
    for case in G.FLASH_CASES + tuple(c for cases in G.VARIANT_CASES.values() for c in cases):
        assert f'    "{case}": case_' in text


def profile_command(tmp_path, monkeypatch, which):
    folder = tmp_path / "folder"
    (folder / "src").mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(G, "HERE", str(folder))
    monkeypatch.setattr(G.shutil, "which", which)
    monkeypatch.delenv("MOE_GPU_PROFILE_ONLY", raising=False)
    ctx = G.Ctx(str(folder / "out"), sys.executable)
    return next(make for name, _, _, make in G.steps(ctx) if name == "profile")(), ctx


def test_profile_runs_one_bench_call_of_the_flash_cases_under_ncu(tmp_path, monkeypatch):
    (cmd, env), ctx = profile_command(tmp_path, monkeypatch, lambda name: "/opt/bin/" + name)
    assert cmd[0] == "/opt/bin/ncu" and cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:_mma_"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--section"] == list(G.PROFILE_SECTIONS)
    assert cmd[cmd.index("--log-file") + 1] == os.path.join(ctx.logs, "bench", "ncu.csv")
    bench = cmd[cmd.index("-m") - 1:]
    assert bench[:3] == [ctx.python, "-m", "bench.gpu.bench_gpu"]
    assert bench[bench.index("--only") + 1] == G.PROFILE_ONLY and bench[bench.index("--reps") + 1] == "1"
    assert bench[bench.index("--out") + 1] == os.path.join(ctx.logs, "profile")   # not the bench step's results
    assert "--no-compile" in bench and env["PYTHONPATH"].split(os.pathsep)[0] == ctx.src


def test_profile_is_skipped_without_ncu_and_runs_only_when_asked(setup, tmp_path, monkeypatch):
    (cmd, reason), _ = profile_command(tmp_path, monkeypatch, lambda name: None)
    assert cmd is None and reason == "ncu is not on PATH"
    # A default run (no MOE_GPU_CHECK_STEPS) leaves it out; naming it runs it.
    monkeypatch.setattr(G, "ASKED_ONLY", ("gpu-b",))
    rc, doc, _ = setup([("build", 0), ("gpu-a", 0), ("gpu-b", 0)], gpu_steps=("gpu-a", "gpu-b"))
    assert list(statuses(doc)) == ["build", "gpu-a"]
    monkeypatch.setenv("MOE_GPU_CHECK_STEPS", "gpu-a,gpu-b")
    rc, doc, _ = setup([("build", 0), ("gpu-a", 0), ("gpu-b", 0)], gpu_steps=("gpu-a", "gpu-b"))
    assert list(statuses(doc)) == ["build", "gpu-a", "gpu-b"]
