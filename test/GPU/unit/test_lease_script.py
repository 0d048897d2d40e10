"""Unit test of test/GPU/check/lease.sh's device side, no GPU needed: against fake check folders (each run.sh records
the environment it was given), one `lease.sh run` unpacks every folder of .dev/, runs the default folder's steps, each
variant's A/B with its own build folder, bench filter and cases, then the racecheck runs within what is left of the
call, and leaves at most 8 files in OUT (what a device call returns)."""

import os
import shutil
import subprocess
import tarfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "check", "lease.sh")

FAKE_RUN = """mkdir -p "$1"
printf '%s\\n' "folder=$(basename "$(dirname "$0")")" "steps=$MOE_GPU_CHECK_STEPS" \\
  "budget=$MOE_GPU_CHECK_BUDGET_S" "build=$MOE_GPU_CHECK_BUILD" "only=${MOE_GPU_CHECK_ONLY:-}" \\
  "bench=${MOE_GPU_BENCH_ARGS:-}" "sanitize=${MOE_GPU_CHECK_SANITIZE_ONLY:-}" "tma=${MOE_GPU_TMA:-}" \
  > "$1/summary.md"
"""


def variant_rows():
    """The VARIANTS table's rows (their |-separated columns), read from the script."""
    rows, inside = [], False
    for line in open(SCRIPT):
        if line.startswith("VARIANTS=("):
            inside = True
        elif inside and line.startswith(")"):
            break
        elif inside and line.strip().startswith('"'):
            rows.append((line.strip().strip('"').split("|") + [""] * 8)[:8])
    return rows


def variants():
    """The VARIANTS table's names."""
    return [row[0] for row in variant_rows()]


def own_folders():
    """The variants that prepare builds a folder for (not those that run an earlier one's again)."""
    return [row[0] for row in variant_rows() if not row[6]]


@pytest.mark.skipif(shutil.which("xz") is None, reason="xz is not installed")
def test_lease_run_against_fake_folders(tmp_path):
    root = tmp_path / "repo"
    (root / "test" / "GPU" / "check").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "test" / "GPU" / "check" / "lease.sh")
    (root / ".dev").mkdir()
    (root / "build").mkdir()
    names = variants()
    assert names, "no VARIANTS table in lease.sh"
    stage = tmp_path / "stage"
    for folder in ["gpu-check"] + ["gc-" + n for n in own_folders()]:
        (stage / folder).mkdir(parents=True)
        (stage / folder / "run.sh").write_text(FAKE_RUN)
        subprocess.run(["tar", "cJf", str(root / ".dev" / f"{folder}.tar.xz"), "-C", str(stage), folder], check=True)
    out = tmp_path / "out"
    w = tmp_path / "w"
    w.mkdir()
    # No torch, nvidia-smi or wheels here: those lines fail and the run goes on, as it must on a partial machine.
    p = subprocess.run(["bash", str(root / "test" / "GPU" / "check" / "lease.sh"), "run"], cwd=str(root),
                       env=dict(os.environ, OUT=str(out), MOE_LEASE_TMP=str(w)), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    files = sorted(os.listdir(out))
    assert len(files) <= 8, files
    runs = {}
    for f in files:
        if f.endswith(".tgz"):
            with tarfile.open(out / f) as t:
                # A run's folder o-NAME/ (race.tgz: every racecheck run's).
                for member in (m for m in t.getnames() if m.endswith("summary.md")):
                    runs[member.split("/")[0][2:]] = dict(
                        line.split("=", 1) for line in t.extractfile(member).read().decode().split("\n")
                        if "=" in line)
    assert "race.tgz" in files and not any(f.startswith("race-") for f in files), files
    assert runs["def"]["folder"] == "gpu-check"
    assert runs["def"]["steps"] == "checks,torch-ops,memcheck,bench,profile"
    assert runs["def"]["build"] == f"{w}/b1"
    for n, _opts, _steps, _bench, _cases, _chip, reuse, extra in variant_rows():
        r = runs[n]
        folder = reuse or "gc-" + n
        assert r["folder"] == folder
        assert r["build"] == f"{w}/b-{folder[3:]}"          # a CMake build folder is bound to its source folder
        assert r["tma"] == ("0" if "MOE_GPU_TMA=0" in extra else "")
        assert r["bench"].startswith("--only ") and r["bench"].endswith("--no-compile --reps 50")
        assert "bench" in r["steps"].split(",")
        assert "|" not in r["only"] + r["sanitize"], r         # the chip column is not read as cases
    # Racecheck: each run's folder and its own build folder, the budgets within the call's 545 s.
    races = {k: v for k, v in runs.items() if k.startswith("race")}
    assert races, "no racecheck run"
    for r in races.values():
        assert r["steps"] == "racecheck" and r["sanitize"].startswith("--only ")
        assert r["build"] == (f"{w}/b1" if r["folder"] == "gpu-check" else f"{w}/b-" + r["folder"][3:])
        assert 40 < int(r["budget"]) <= 545
    assert "== done at" in p.stdout
