"""Unit tests of the GPU harness (test/GPU/run_gpu_tests.py) that need no GPU:
its argument parsing (--only) and its stream handling, against a fake runtime,
a fake compiled library and a fake torch.cuda that record what happens in
which order. Run by the lit test test/GPU/harness-unit.mlir.

  python -m pytest test/GPU/unit -q
"""

import ctypes
import importlib.util
import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("run_gpu_tests",
                                              os.path.join(HERE, "..", "run_gpu_tests.py"))
H = importlib.util.module_from_spec(spec)
spec.loader.exec_module(H)

#===----------------------------------------------------------------------===#
# --only
#===----------------------------------------------------------------------===#


def test_only_accepts_repeats_and_commas_in_case_order():
    a = H.parse_args(["--lib", "l", "--runtime-dir", "d", "--only", "mad_dispersion,topk_renorm",
                      "--only", "hyper_router"])
    assert a.cases == ["topk_renorm", "mad_dispersion", "hyper_router"]


def test_only_absent_runs_every_case():
    a = H.parse_args(["--lib", "l", "--runtime-dir", "d"])
    assert a.cases == list(H.CASES)


def test_only_options_after_it_stay_options():
    # nargs="*" used to be greedy: make sure the following options are still parsed.
    a = H.parse_args(["--only", "topk_renorm", "--lib", "l", "--runtime-dir", "d", "--json", "j"])
    assert (a.cases, a.lib, a.runtime_dir, a.json) == (["topk_renorm"], "l", "d", "j")


@pytest.mark.parametrize("only", [["bogus"], ["topk_renorm,bogus"], [""], [","]])
def test_only_unknown_or_empty_is_an_error(only, capsys):
    argv = ["--lib", "l", "--runtime-dir", "d"]
    for o in only:
        argv += ["--only", o]
    with pytest.raises(SystemExit) as exc:
        H.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "bogus" in err or "at least one" in err


def test_summary_counts_only_the_cases_run(capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(H, "CASES", {"a": lambda lib, g: calls.append("a"),
                                     "b": lambda lib, g: (_ for _ in ()).throw(AssertionError("bad")),
                                     "c": lambda lib, g: calls.append("c")})

    class Lib:
        cuda = FakeCuda([])
    recs = H.run_cases(Lib(), ["a", "b"])
    assert calls == ["a"]
    assert [(r["name"], r["status"]) for r in recs] == [("a", "pass"), ("b", "fail")]
    assert "bad" in recs[1]["message"]
    assert Lib.cuda.log == ["device sync", "device sync"]   # each case is drained before the next


#===----------------------------------------------------------------------===#
# Stream handling, against fakes
#===----------------------------------------------------------------------===#


class FakeStream:
    def __init__(self, handle, log):
        self.cuda_stream, self.log = handle, log

    def synchronize(self):
        self.log.append(("sync", self.cuda_stream))


class FakeCuda:
    def __init__(self, log, handle=0x5000):
        self.log, self.stream = log, FakeStream(handle, log)

    def current_stream(self):
        return self.stream

    def synchronize(self):
        self.log.append("device sync")


class Fn:
    def __init__(self, name, log, impl=None):
        self.name, self.log, self.impl = name, log, impl

    def __call__(self, *args):
        self.log.append((self.name,) + tuple(_plain(a) for a in args))
        return self.impl(*args) if self.impl else 0


def _plain(a):
    if isinstance(a, ctypes.c_void_p):
        return a.value
    return a if isinstance(a, (int, type(None))) else "?"


class FakeDll:
    def __init__(self, log, impls):
        self._log, self._impls = log, impls

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        f = Fn(name, self._log, self._impls.get(name))
        setattr(self, name, f)
        return f


def make_library(log, result_source, raise_in_call=False, poll=True):
    """A Library over fakes: the compiled `f` returns one 2x3 f32 memref whose
    data is `result_source` (a CPU tensor); mgpuMemcpy copies host memory."""

    def compiled(res_ref, *arg_refs):
        if raise_in_call:
            raise RuntimeError("kernel launch failed")
        d = ctypes.cast(res_ref, ctypes.POINTER(H.memref_type(2))).contents
        d.allocated = d.aligned = result_source.data_ptr()
        d.sizes[0], d.sizes[1] = 2, 3
        d.strides[0], d.strides[1] = 3, 1

    def memcpy(dst, src, n, stream):
        ctypes.memmove(dst, src, n)

    rt_impls = {"mgpuMemcpy": memcpy, "moeGpuTakeDriverError": lambda buf, n: 0}
    if not poll:
        rt_impls["moeGpuPollErrors"] = None

    def loader(path, mode=None):
        base = os.path.basename(path)
        if base == "libmoe_cuda_runtime.so":
            dll = FakeDll(log, rt_impls)
            if not poll:
                dll.moeGpuPollErrors = None
            return dll
        if base == "libmoe_cpu_runtime.so":
            return FakeDll(log, {})
        return FakeDll(log, {"_mlir_ciface_f": compiled})

    # FakeDll hides underscore names from getattr; expose the compiled function.
    lib = H.Library("libcases.so", "/rt", cuda=FakeCuda(log), loader=loader)
    lib.lib = type("Compiled", (), {"_mlir_ciface_f": Fn("_mlir_ciface_f", log, compiled)})()
    lib.device = "cpu"
    return lib


def names(log):
    return [e[0] if isinstance(e, tuple) else e for e in log]


def test_call_runs_on_torch_current_stream_and_syncs_before_free():
    log = []
    src = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    lib = make_library(log, src)
    (out,) = lib.call("f", [torch.zeros(4)], [((2, 3), torch.float32)])
    assert torch.equal(out, src)
    seq = [e for e in log if names([e])[0] in
           ("moeGpuSetStream", "_mlir_ciface_f", "mgpuMemcpy", "sync", "moeGpuFree",
            "moeGpuPollErrors")]
    # The race of issue #14: the call must run on torch's stream (0x5000), which
    # orders it after the in-place edits of its inputs, not on a fresh stream.
    assert seq[0] == ("moeGpuSetStream", 0x5000)
    assert seq[1][0] == "_mlir_ciface_f"
    assert seq[2][0] == "mgpuMemcpy" and seq[2][-1] == 0x5000      # copy on the same stream
    assert seq[3] == ("sync", 0x5000)                               # harness syncs itself
    assert seq[4][0] == "moeGpuFree"                                # free after the sync
    assert seq[5][0] == "moeGpuPollErrors"                          # error word after the sync
    assert seq[6] == ("moeGpuSetStream", None)                      # ambient stream reset


def test_default_stream_is_passed_as_the_legacy_stream():
    """torch's default stream has handle 0, which the runtime would read as "no ambient stream" (and run the call
    on a non-blocking stream of its own, unordered with torch's writes of the inputs): the harness passes
    CU_STREAM_LEGACY (1) instead."""
    assert H.stream_handle(FakeStream(0, [])) == H.CU_STREAM_LEGACY == 1
    assert H.stream_handle(FakeStream(0x5000, [])) == 0x5000


def test_ambient_stream_is_reset_when_the_call_raises():
    log = []
    lib = make_library(log, torch.zeros(2, 3), raise_in_call=True)
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        lib.call("f", [torch.zeros(4)], [((2, 3), torch.float32)])
    assert log[-1] == ("moeGpuSetStream", None)


def test_old_runtime_without_poll_is_accepted():
    log = []
    lib = make_library(log, torch.ones(2, 3), poll=False)
    assert lib.poll_errors is None
    (out,) = lib.call("f", [torch.zeros(1)], [((2, 3), torch.float32)])
    assert torch.equal(out, torch.ones(2, 3))


def test_skip_without_cuda_writes_json(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as exc:
        H.main(["--lib", "l", "--runtime-dir", "d", "--json", str(out)])
    assert exc.value.code == H.SKIP
    assert "no CUDA device" in json.loads(out.read_text())["skipped"]


#===----------------------------------------------------------------------===#
# --manifest: the kernel variants the library was built with
#===----------------------------------------------------------------------===#


def test_manifest_options_are_read(tmp_path):
    """The pipeline options moe-aot.py records in the manifest are the harness's record of the kernel variants its
    cases ran on (the results' aot_options); no manifest, or one of an older moe-aot.py: none."""
    m = tmp_path / "gpu-cases.manifest.json"
    options = "flash-mma-block-rows=64 flash-mma-grad=true"
    m.write_text(json.dumps({"name": "gpu-cases", "pipeline_options": options}))
    assert H.parse_args(["--lib", "l", "--runtime-dir", "d", "--manifest", str(m)]).manifest == str(m)
    assert H.aot_options_of(str(m)) == options
    assert H.aot_options_of(None) == ""
    m.write_text(json.dumps({"name": "gpu-cases"}))  # a manifest of an older moe-aot.py
    assert H.aot_options_of(str(m)) == ""
