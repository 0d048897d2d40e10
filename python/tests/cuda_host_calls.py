"""What one ``torch.ops.moe.*`` call on CUDA tensors asks of the CUDA driver, measured with no GPU.

The kernel cache builds real CUDA kernels here (``moe-lower-to-nvvm``, ptxas, the fatbin embedded in the host
object: :func:`moe_mlir.runtime.cache._load_cuda`) and loads them against ``libmoe_cuda_runtime.so`` built over the
fake driver of test/GPU/runtime/FakeCuda.cpp (``build/lib/fake-cuda/``), which records every driver call and runs no
kernel. Each case's kernel is then called as the torch extension calls it (descriptors of its inputs, then of its
outputs; PyTorch's stream as the runtime's ambient stream; the primary context current, as PyTorch leaves it): once
to warm up, then once with the record cleared (the driver calls of one steady-state call), then ``--repeat`` times
for the host time of the compiled host code and the runtime (the driver's own cost not included: the fake's calls
are a vector append).

What a call may do is what a CUDA graph can capture and what keeps a decode step's host time low: launches and
stream-ordered allocations, copies and memsets on the ambient stream, nothing that waits for the device, creates a
stream, loads a module or switches contexts. python/tests/test_cuda_host_calls.py holds every case to that.

  MOE_CUDA_RUNTIME=build/lib/fake-cuda/libmoe_cuda_runtime.so MOE_GPU_CHIP=sm_90 \\
      python python/tests/cuda_host_calls.py [--repeat N]        # one JSON line per case
"""
from __future__ import annotations

import argparse
import ctypes
import json
import time
from dataclasses import dataclass
from typing import Optional

import torch

#: A stand-in for PyTorch's current stream: any non-null handle (the fake driver never dereferences it).
AMBIENT_STREAM = 0x5EED


@dataclass(frozen=True)
class Case:
    name: str
    key: str
    #: (dtype, shape) of each input, in the key's order, then of each output (the kernel's out-parameters).
    inputs: tuple[tuple[torch.dtype, tuple[int, ...]], ...]
    outputs: tuple[tuple[torch.dtype, tuple[int, ...]], ...]
    #: The kernels one call launches.
    launches: int
    #: Its stream-ordered allocations (each freed in the call) and memsets.
    allocs: int = 0
    memsets: int = 0
    #: Its kernel lookups at the first call (later calls reuse them), where more than its launches: topk_renorm's
    #: host code (topk-rounds=list-redux) has a launch of each register kernel, the one the token count does not
    #: pick over an empty grid, which the runtime does not launch but whose function the host code has looked up.
    lookups: Optional[int] = None


T = 64  # decode: the host cost is what decides there
_F32, _I32, _BF16 = torch.float32, torch.int32, torch.bfloat16
_DSV3 = ("route|k=8|scoring=sigmoid|order=score_then_topk|n_group=8|topk_group=4|group_score=top2_sum|renormalize=1"
         "|routed_scaling_factor=2.5|in:logits:f32:?x256|in:bias:f32:256")
_PLAN_PADDED = T * 8 + 256 * 63

CASES = [
    Case("topk_renorm_K64", "topk_renorm|k=8|mode=logits|renormalize=1|in:scores:f32:?x64",
         ((_F32, (T, 64)),), ((_F32, (T, 8)), (_I32, (T, 8))), 1, lookups=2),
    Case("topk_renorm_K256_bf16", "topk_renorm|k=8|mode=logits|renormalize=1|in:scores:bf16:?x256",
         ((_BF16, (T, 256)),), ((_F32, (T, 8)), (_I32, (T, 8))), 1, lookups=2),
    Case("topk_renorm_backward", "topk_renorm_backward|mode=logits|renormalize=1|in:scores:f32:?x64"
         "|in:indices:i32:?x8|in:grad_w:f32:?x8",
         ((_F32, (T, 64)), (_I32, (T, 8)), (_F32, (T, 8))), ((_F32, (T, 64)),), 1),
    Case("route_deepseek_v3", _DSV3, ((_F32, (T, 256)), (_F32, (256,))), ((_F32, (T, 8)), (_I32, (T, 8))), 1),
    Case("route_softmax_E128", "route|k=8|scoring=softmax|order=score_then_topk|n_group=1|topk_group=1"
         "|group_score=top2_sum|renormalize=1|routed_scaling_factor=1|in:logits:f32:?x128",
         ((_F32, (T, 128)),), ((_F32, (T, 8)), (_I32, (T, 8))), 1),
    Case("dispatch_plan_E256", "dispatch_plan|num_experts=256|block_size=64|in:indices:i32:?x8",
         ((_I32, (T, 8)),),
         ((_I32, (256,)), (_I32, (257,)), (_I32, (T * 8,)), (_I32, (T * 8,)), (_I32, (_PLAN_PADDED,)),
          (_I32, ((_PLAN_PADDED + 63) // 64,)), (_I32, (1,))), 3, allocs=1),
    Case("similarity_inform_bf16", "similarity_inform|tau=0.5|causal=0|in:u:bf16:?x?x64|in:e:bf16:?x?x16",
         # One split (one key tile): the direct 128-row kernel alone; the split kernel and its combine launch over
         # empty grids (looked up, not launched) with an empty workspace (no allocation).
         ((_BF16, (1, T, 64)), (_BF16, (1, T, 16))), ((_F32, (1, T, 16)),), 1, lookups=3),
]


def _tensors(specs) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for dtype, shape in specs:
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g).to(dtype))
        else:
            out.append(torch.randint(0, 8, shape, generator=g, dtype=dtype))
    return out


def probe(case: Case, repeat: int) -> dict:
    from moe_mlir.runtime import abi, cache, cuda

    rt = cuda.runtime()
    fake = rt.rt
    fake.moeFakeCudaTakeCalls.restype = ctypes.c_int64
    fake.moeFakeCudaTakeCalls.argtypes = [ctypes.c_char_p, ctypes.c_int64]

    fake.moeFakeCudaTakeStreams.restype = ctypes.c_int64
    fake.moeFakeCudaTakeStreams.argtypes = [ctypes.c_char_p, ctypes.c_int64]

    def take_lines(fn) -> list[str]:
        n = fn(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        fn(buf, n + 1)
        return [c for c in buf.value.decode().split("\n") if c]

    def take() -> list[str]:
        take_lines(fake.moeFakeCudaTakeStreams)
        return take_lines(fake.moeFakeCudaTakeCalls)

    fake.moeFakeCudaSetCurrent(1)
    key = f"{case.key}|device=cuda:0"
    _lib, addr = cache._load_cuda(cache.parse_key(key), key)
    load_calls = take()
    tensors = _tensors(case.inputs) + _tensors(case.outputs)
    descs = [abi.describe(t) for t in tensors]
    ptrs = [ctypes.cast(ctypes.pointer(d), ctypes.c_void_p) for d in descs]
    fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(ptrs))(addr)

    rt.rt.moeGpuSetStream(ctypes.c_void_p(AMBIENT_STREAM))
    fn(*ptrs)  # warm-up: the first call may look up what later calls reuse
    first = take()
    fn(*ptrs)
    streams = sorted({int(line.split()[1]) for line in take_lines(fake.moeFakeCudaTakeStreams)})
    steady = take()
    def ns_per_call(f) -> float:  # the best of 5 rounds of `repeat` calls (the record cleared after each)
        rounds = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(repeat):
                f(*ptrs)
            rounds.append((time.perf_counter_ns() - t0) / repeat)
            take()
        return min(rounds)

    # Less the same loop over a ctypes call of a C function that does nothing: what the Python side of this
    # measurement costs.
    noop = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(ptrs))(
        ctypes.cast(fake.moeFakeCudaNoop, ctypes.c_void_p).value)
    host_ns = ns_per_call(fn) - ns_per_call(noop)
    rt.rt.moeGpuSetStream(None)
    err = rt.take_driver_error()
    return {"case": case.name, "key": case.key, "launches_expected": case.launches, "load": load_calls,
            "first": first, "steady": steady,
            "streams": streams, "ambient_stream": AMBIENT_STREAM, "host_ns": round(host_ns),
            "driver_error": err or ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    for case in CASES:
        if args.only and args.only not in case.name:
            continue
        print(json.dumps(probe(case, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
