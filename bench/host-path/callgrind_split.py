#!/usr/bin/env python3
"""Instructions per call of moe-cuda-runtime-host-path, split by whose code ran them.

Usage: callgrind_split.py CALLS callgrind.out...   (from `valgrind --tool=callgrind --toggle-collect='*hostPathCall*'
moe-cuda-runtime-host-path --case NAME --calls CALLS`). Self cost of each function (callgrind_annotate), classed as
the fake driver's (cu*, FakeCuda.cpp's recorders, the allocator and memset its fake allocations call), the replayed
caller's (HostPathBench.cpp: the compiled host code's and launchOnCurrentStream's calls), or the runtime's
(lib/Runtime/CUDA/MoECudaRuntime.cpp: everything else).
"""
import re
import subprocess
import sys

FAKE_LIBC = ("malloc", "free", "memset", "_int_", "memalign", "unlink_chunk", "consolidate")


def whose(function: str) -> str:
    name = function.split(":", 1)[1] if ":" in function else function
    name = re.sub(r" \[.*\]$", "", name)
    if re.match(r"cu[A-Z]", name) or "::note" in name or "::alloc(" in name or "::ptr(" in name or "fake_cuda" in name:
        return "driver"
    if "libc.so" in function and any(k in name for k in FAKE_LIBC):
        return "driver"
    if re.search(r"Host\(\)|hostPathCall|::launch\(char", name):
        return "caller"
    return "runtime"


def split(path: str, calls: int) -> dict:
    text = subprocess.run(["callgrind_annotate", "--threshold=100", path], capture_output=True, text=True).stdout
    body = text.split("file:function", 1)[1]
    out = {"driver": 0, "caller": 0, "runtime": 0}
    for line in body.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*)", line)
        if m and "PROGRAM TOTALS" not in line:
            out[whose(m.group(2))] += int(m.group(1).replace(",", ""))
    out = {k: v / calls for k, v in out.items()}
    out["total"] = sum(out.values())
    return out


if __name__ == "__main__":
    calls = int(sys.argv[1])
    for path in sys.argv[2:]:
        r = split(path, calls)
        print(f"{path}: total {r['total']:.1f} = runtime {r['runtime']:.1f} + caller {r['caller']:.1f}"
              f" + fake driver {r['driver']:.1f} Ir/call")
