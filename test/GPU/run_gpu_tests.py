#!/usr/bin/env python3
"""GPU harness: calls the ahead-of-time compiled moe functions of
test/GPU/Inputs/gpu-cases.mlir on PyTorch CUDA tensors and compares every
result with an eager PyTorch reference (the formulas of the op descriptions,
in float64).

  run_gpu_tests.py --lib libgpu-cases.so --runtime-dir DIR [--manifest NAME.manifest.json]
                   [--only CASE[,CASE...]]... [--json FILE]

--only takes case names (see --list), repeated or comma-separated; an unknown
name is an error (exit 2), never a silent pass. --json writes one record per
case (name, status, message, seconds) plus the device and torch version.

Stream handling: every compiled call runs on PyTorch's current stream (set as
the runtime's ambient stream), so it is ordered after the in-place edits that
prepared its inputs; the harness synchronizes that stream itself before it
reads results, frees them or reads the device error word, and never relies on
the compiled host code to synchronize.

Exit status: 0 all passed, 1 a failure, 2 bad arguments, 77 skipped (no torch,
no CUDA device or no runtime library): ctest's SKIP_RETURN_CODE; the reason is
printed.
"""

import argparse
import ctypes
import importlib.util
import math
import os
import sys
import time

SKIP = 77


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


try:
    import torch
except Exception as exc:  # noqa: BLE001
    skip(f"PyTorch is not importable ({exc})")

#===----------------------------------------------------------------------===#
# Memref descriptors and calls
#===----------------------------------------------------------------------===#

def _load_abi():
    """python/moe_mlir/runtime/abi.py, the package's one marshalling module,
    loaded by its path: the harness runs from a copy of the sources without
    the package installed (scripts/gpu-check.sh copies that file too)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "python", "moe_mlir", "runtime", "abi.py")
    spec = importlib.util.spec_from_file_location("moe_mlir_abi", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


abi = _load_abi()
memref_type = abi.memref_struct
result_descriptors = abi.result_descriptors


def descriptor(t):
    """A descriptor over a contiguous copy of `t` (or `t` itself), and that
    tensor, which must stay alive while the descriptor is used."""
    t = t.contiguous()
    return abi.describe(t), t



#: CU_STREAM_LEGACY: the driver API's name for the default stream that the runtime API (and torch, whose default
#: stream's handle is 0) calls 0. The runtime reads an ambient stream of 0 as none and would run the call on a
#: stream of its own, created non-blocking, so unordered with torch's default stream: the kernels could then read
#: inputs torch has not finished writing (seen on an H200 under racecheck, 2026-11-26: a freshly zeroed input read
#: before its fill; lib/Runtime/Torch/TorchCudaOps.cpp's kLegacyStream is the extension's same mapping).
CU_STREAM_LEGACY = 0x1


def stream_handle(stream):
    """The handle the runtime's moeGpuSetStream takes for torch's `stream`: its own, or CU_STREAM_LEGACY for the
    default stream (0)."""
    return stream.cuda_stream or CU_STREAM_LEGACY

class Library:
    """The compiled cases plus the two runtime libraries.

    `cuda` is the torch.cuda-like module used for streams (a parameter so that
    the stream handling can be tested with a fake one, test/GPU/unit)."""

    def __init__(self, lib, runtime_dir, cuda=None, loader=ctypes.CDLL):
        self.cuda = cuda if cuda is not None else torch.cuda
        self.cpu = loader(os.path.join(runtime_dir, "libmoe_cpu_runtime.so"),
                          mode=ctypes.RTLD_GLOBAL)
        self.rt = loader(os.path.join(runtime_dir, "libmoe_cuda_runtime.so"),
                         mode=ctypes.RTLD_GLOBAL)
        self.rt.moeGpuDeviceCount.restype = ctypes.c_int32
        self.rt.mgpuMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_void_p]
        self.rt.moeGpuFree.argtypes = [ctypes.c_void_p]
        self.rt.moeGpuSetStream.argtypes = [ctypes.c_void_p]
        self.cpu.moeTakeError.argtypes = [ctypes.c_char_p, ctypes.c_int64]
        self.cpu.moeTakeError.restype = ctypes.c_int32
        self.cpu.moeSetErrorEcho.argtypes = [ctypes.c_int32]
        self.rt.moeGpuTakeDriverError.argtypes = [ctypes.c_char_p, ctypes.c_int64]
        self.rt.moeGpuTakeDriverError.restype = ctypes.c_int32
        # Reads (and clears) the device error word once the caller has synchronized;
        # absent in runtimes older than this harness.
        self.poll_errors = getattr(self.rt, "moeGpuPollErrors", None)
        if self.poll_errors is not None:
            self.poll_errors.restype = ctypes.c_int32
        self.lib = loader(lib)
        self.device = "cuda"       # where result copies are made
        self.results_after_error = True   # the kernels skip a bad element and write the rest

    def take_error(self):
        buf = ctypes.create_string_buffer(512)
        return buf.value.decode() if self.cpu.moeTakeError(buf, 512) else None

    def driver_error(self):
        buf = ctypes.create_string_buffer(512)
        return buf.value.decode() if self.rt.moeGpuTakeDriverError(buf, 512) else None

    def call(self, name, args, results):
        """results: [(shape, torch dtype)]; returns CUDA tensors (copies).

        The call runs on torch's current stream, so the kernels see inputs that
        earlier torch work on that stream (in-place edits included) wrote; the
        stream is synchronized before results are freed and before the error
        word is read."""
        descs = [descriptor(a) for a in args]
        res, descs_out = result_descriptors([len(shape) for shape, _ in results])
        fn = getattr(self.lib, "_mlir_ciface_" + name)
        fn.restype = None
        stream = self.cuda.current_stream()
        handle = ctypes.c_void_p(stream_handle(stream))
        out = []
        self.rt.moeGpuSetStream(handle)
        try:
            fn(ctypes.byref(res), *[ctypes.byref(d) for d, _ in descs])
            for d, (shape, dtype) in zip(descs_out, results):
                sizes = list(d.sizes) if len(shape) else []     # a rank-0 descriptor has no sizes
                assert sizes == list(shape), (name, sizes, shape)
                t = torch.empty(shape, dtype=dtype, device=self.device)
                nbytes = t.numel() * t.element_size()
                if nbytes:
                    self.rt.mgpuMemcpy(t.data_ptr(), d.aligned, nbytes, handle)
                out.append(t)
            # Results are read and freed only after the stream has finished with them.
            stream.synchronize()
            for d in descs_out:
                self.rt.moeGpuFree(d.allocated)
            if self.poll_errors is not None:
                self.poll_errors()
        finally:
            self.rt.moeGpuSetStream(None)
            del descs                                      # inputs stay alive up to here
        err = self.driver_error()
        if err:
            raise RuntimeError(f"{name}: CUDA driver error: {err}")
        return out


class CpuLibrary:
    """--cpu-dry-run: the same functions compiled for the CPU by the execution API (libMoEExecutorC.so of a
    build with LLVM), so that the cases and their references can be checked without a GPU. Run-time index
    errors come back as errors of the call and are kept for take_error."""

    def __init__(self, mlir_path):
        repo = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
        sys.path.insert(0, os.path.join(repo, "python"))
        from moe_mlir.backends.cpu import ExecutorLibrary
        from moe_mlir.backends.tools import MoERuntimeError
        self.error_type = MoERuntimeError
        self.ex = ExecutorLibrary.find()
        if self.ex is None:
            skip("libMoEExecutorC.so not found (set MOE_BUILD_DIR)")
        with open(mlir_path) as f:
            self.handle = self.ex.compile(f.read())
        self.error = None
        self.results_after_error = False   # the execution API returns the error instead of results
        self.cuda = type("NoCuda", (), {"synchronize": staticmethod(lambda: None)})()
        self.cpu = type("NoEcho", (), {"moeSetErrorEcho": staticmethod(lambda on: None)})()

    def take_error(self):
        err, self.error = self.error, None
        return err

    def call(self, name, args, results):
        out = [torch.empty(shape, dtype=dtype) for shape, dtype in results]
        try:
            self.ex.call(self.handle, name, [a.contiguous() for a in args], out)
        except self.error_type as exc:
            self.error = str(exc)
        return out


DEV = "cuda"       # where the cases put their tensors ("cpu" with --cpu-dry-run)

#===----------------------------------------------------------------------===#
# References (float64)
#===----------------------------------------------------------------------===#

NEG_INF = float("-inf")


def adversarial_rows(x, g):
    """The first six rows of `x` made hard for a register top-k (topk-rounds=list, route-map=lanes): sorted
    descending (the best picks crowd one lane's list, which runs out and refills) and ascending, all -inf, a NaN,
    small integers (ties across lanes), -inf every third element."""
    x[0] = x[0].sort(descending=True).values
    x[1] = x[1].sort().values
    x[2] = NEG_INF
    x[3, 5] = float("nan")
    x[4] = torch.randint(-2, 3, x[4].shape, generator=g).to(x.dtype)
    x[5, ::3] = NEG_INF
    return x


def ref_topk(scores, k, mode="logits", renormalize=True):
    x = scores.double()
    # torch.sort puts NaN first in descending order; stable = lowest index on ties.
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]
    vals = x.gather(-1, order)
    if mode == "logits" and renormalize:
        v0 = vals[..., :1]
        w = torch.exp(vals - v0)
        w = w / w.sum(-1, keepdim=True)
        w = torch.where(v0 == NEG_INF, torch.zeros_like(w), w)
    elif mode == "logits":
        m = x.amax(-1, keepdim=True)
        dense = torch.exp(x - m) / torch.exp(x - m).sum(-1, keepdim=True)
        dense = torch.where(m == NEG_INF, torch.zeros_like(dense), dense)
        dense = torch.where(torch.isnan(x).any(-1, keepdim=True),
                            torch.full_like(dense, float("nan")), dense)
        w = dense.gather(-1, order)
    elif renormalize:
        s = vals.sum(-1, keepdim=True)
        w = torch.where(s == 0, torch.zeros_like(vals), vals / s)
    else:
        w = vals
    return w.float(), order.int()


def masked_softmax_mix(logits, e):
    """Σ_j softmax_j(logits) e_j with fully masked rows -> 0."""
    m = logits.amax(-1, keepdim=True)
    safe = torch.where(m == NEG_INF, torch.zeros_like(m), m)
    p = torch.exp(logits - safe)
    s = p.sum(-1, keepdim=True)
    a = torch.where(s == 0, torch.zeros_like(p), p / s)
    return a @ e.double()


def similarity_logits(u, tau, causal, ws, key_mask):
    """u_i^T W_s u_j / tau [B, N, N] of float64 u (and ws), -inf where the key is masked or in the future."""
    q = u @ ws if ws is not None else u
    logits = q @ u.transpose(1, 2) / tau
    n = u.shape[1]
    if causal:
        tri = torch.ones(n, n, dtype=torch.bool, device=u.device).tril()
        logits = logits.masked_fill(~tri, NEG_INF)
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask[:, None, :], NEG_INF)
    return logits


def ref_similarity(u, e, tau=1.0, causal=False, ws=None, key_mask=None):
    ws = ws.double() if ws is not None else None
    return masked_softmax_mix(similarity_logits(u.double(), tau, causal, ws, key_mask), e)


def ref_attention(scores, u, v, wo, e, sigma=1.0, head_scale=None):
    s = scores.double()
    B, H, N, Nk = s.shape
    Dh = v.shape[-1]
    hs = float(H) if head_scale is None else head_scale
    p_prior = torch.softmax(s, -1)
    plogp = torch.where(p_prior > 0, p_prior * torch.log(p_prior), torch.zeros_like(p_prior))
    ent = -plogp.sum(-1)  # [B,H,N]
    valid = (s != NEG_INF).any(-1)
    cnt = valid.sum(-1).double()
    tot = torch.where(valid, ent, torch.zeros_like(ent)).sum(-1)
    mean = torch.where(cnt > 0, tot / cnt.clamp(min=1), torch.zeros_like(tot))
    heads = []
    out = []
    for b in range(B):
        row = mean[b]
        nan = torch.isnan(row)
        h = int(torch.nonzero(nan)[0]) if nan.any() else int(torch.argmin(row))
        heads.append(h)
        m = hs * v[b, h].double() @ wo[:, h * Dh:(h + 1) * Dh].double().t()  # [Nk, D]
        logits = s[b, h] + u[b].double() @ m.t() / sigma ** 2 - (m * m).sum(-1) / (2 * sigma ** 2)
        out.append(masked_softmax_mix(logits, e[b]))
    return torch.stack(out), torch.tensor(heads, dtype=torch.int32, device=scores.device)


def ref_mad(x, assign, E, eps=1e-4, clip=10.0, normalize="feature", measure="mad",
            empty="identity"):
    x = x.double()
    a = assign.long()
    counts = torch.bincount(a, minlength=E)[:E]
    sums = torch.zeros(E, x.shape[1], dtype=torch.float64, device=x.device).index_add_(0, a, x)
    cnt = counts.double()[:, None]
    mu = torch.where(cnt > 0, sums / cnt.clamp(min=1), torch.zeros_like(sums))
    d = x - mu[a]
    d = d.abs() if measure == "mad" else d * d
    dev = torch.zeros_like(sums).index_add_(0, a, d)
    s = torch.where(cnt > 0, dev / cnt.clamp(min=1), torch.zeros_like(dev))
    w = 1.0 / (s + eps)
    inc = (counts >= 2) if empty == "identity" else torch.ones_like(counts, dtype=torch.bool)
    incf = inc.double()[:, None].expand_as(w)
    if clip > 0:
        w = torch.minimum(w, clip * (w * incf).sum() / incf.sum())
    if normalize == "feature":
        scale = (w * incf).sum(0, keepdim=True) / incf.sum(0, keepdim=True)
    elif normalize == "expert":
        scale = w.mean(1, keepdim=True)
    else:
        scale = (w * incf).sum() / incf.sum()
    w = torch.where(incf > 0, w / scale, torch.ones_like(w))
    return w.float(), counts.int()


def ref_adjacency(a, idx, beta=0.9, norm="row", include_self=True):
    E = a.shape[0]
    S = torch.zeros(idx.shape[0], E, dtype=torch.float64, device=a.device)
    S.scatter_(1, idx.long(), 1.0)
    C = S.t() @ S
    if not include_self:
        C.fill_diagonal_(0)
    if norm == "row":
        s = C.sum(1, keepdim=True)
        C = torch.where(s == 0, torch.zeros_like(C), C / s)
    elif norm == "col":
        s = C.sum(0, keepdim=True)
        C = torch.where(s == 0, torch.zeros_like(C), C / s)
    return (beta * a.double() + (1 - beta) * C).float()


def ref_hyper(emb, w1, b1, w2, b2, E):
    h = torch.relu(w1.double() @ emb.double() + b1.double())
    out = (w2.double() @ h + b2.double()).reshape(E, -1)
    return out[:, :-1].float(), out[:, -1].float()


def ref_hyper_grad(emb, w1, b1, w2, b2, dw, db, E):
    """moe.hyper_router_grad by float64 autograd of the forward (ref_hyper's formula): the gradients of
    <w, dw> + <b, db> with respect to emb, w1, b1, w2, b2 (PyTorch's relu backward: 0 at a = 0, a NaN passes)."""
    ins = [t.double().detach().requires_grad_() for t in (emb, w1, b1, w2, b2)]
    h = torch.relu(ins[1] @ ins[0] + ins[2])
    out = (ins[3] @ h + ins[4]).reshape(E, -1)
    loss = (out[:, :-1] * dw.double()).sum() + (out[:, -1] * db.double()).sum()
    return torch.autograd.grad(loss, ins)


def ref_route(logits, bias, k, scoring="softmax", order="score_then_topk", n_group=1, topk_group=1,
              group_score="top2_sum", renormalize=False, scale=1.0, replay=None):
    """moe.route (MoERoutingOps.td) in float64: (weights, indices, choice values); with `replay` [T, k] the choice
    given (the groups and the bias then choose nothing)."""
    x = logits.double()
    b = torch.zeros(x.shape[-1], dtype=torch.float64, device=x.device) if bias is None else bias.double()

    def score(v, dim_softmax):
        if scoring == "sigmoid":
            return torch.sigmoid(v)
        if scoring == "sqrtsoftplus":  # the custom score region of route_deepseek_v4 (gpu-cases.mlir)
            return torch.sqrt(torch.nn.functional.softplus(v))
        if scoring == "softmax":
            m = v.amax(-1, keepdim=True)
            p = torch.exp(v - m) / torch.exp(v - m).sum(-1, keepdim=True)
            return torch.where(m == NEG_INF, torch.zeros_like(p), p)
        return v

    s = score(x, True) if order == "score_then_topk" else x
    c = s + b
    idx = replay.long().to(c.device) if replay is not None else ref_route_choice(c, k, n_group, topk_group,
                                                                                 group_score)
    w = s.gather(-1, idx)
    if order == "topk_then_score":
        w = score(w, True)
    if renormalize:
        t = w.sum(-1, keepdim=True)
        w = torch.where(t == 0, torch.zeros_like(w), w / t)
    return (w * scale).float(), idx.int(), c.gather(-1, idx)


def ref_route_choice(c, k, n_group, topk_group, group_score):
    """ref_route's choice [T, k] from the choice values c [T, E]: the kept groups' experts first, then descending c
    (NaN first), then the lower index."""
    T, E = c.shape
    kept = torch.ones_like(c, dtype=torch.bool)
    if n_group > 1:
        cg = torch.sort(c.view(T, n_group, E // n_group), dim=-1, descending=True, stable=True).values
        gs = cg[..., 0] + cg[..., 1] if group_score == "top2_sum" else cg[..., 0]
        top = torch.sort(gs, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        gk = torch.zeros(T, n_group, dtype=torch.bool, device=c.device).scatter_(1, top, True)
        kept = gk.repeat_interleave(E // n_group, dim=1)
    o = torch.sort(c, dim=-1, descending=True, stable=True).indices
    o = o.gather(-1, torch.sort(kept.gather(-1, o).int(), dim=-1, descending=True, stable=True).indices)
    return o[:, :k]


def ref_dispatch_plan(indices, E, B=1):
    """moe.dispatch_plan in plain Python (the op description)."""
    flat = [int(v) for v in indices.reshape(-1).tolist()]
    N = len(flat)
    counts = [0] * E
    for v in flat:
        if 0 <= v < E:
            counts[v] += 1
    offsets, poff = [0], [0]
    for e in range(E):
        offsets.append(offsets[-1] + counts[e])
        poff.append(poff[-1] + -(-counts[e] // B) * B)
    order, inverse = [-1] * N, [-1] * N
    padded = [N] * (N + E * (B - 1))
    fill = list(offsets[:-1])
    for n, v in enumerate(flat):
        if 0 <= v < E:
            p = fill[v]
            fill[v] += 1
            order[p], inverse[n] = n, p
            padded[poff[v] + p - offsets[v]] = n
    blocks = [-1] * (-(-(N + E * (B - 1)) // B))
    for e in range(E):
        for blk in range(poff[e] // B, poff[e + 1] // B):
            blocks[blk] = e
    t = lambda a: torch.tensor(a, dtype=torch.int32)
    return [t(counts), t(offsets), t(order), t(inverse), t(padded), t(blocks), t([poff[-1]])]


def bal_probs(x):
    """softmax(x) of float64 logits [T, E] as the balance ops take it (p = exp(x - lse)): a row of -inf gives 0,
    never NaN; NaN propagates."""
    lse = torch.logsumexp(x, -1, keepdim=True)
    p = torch.exp(x - lse)
    return torch.where(lse == NEG_INF, torch.zeros_like(p), p)


def bal_weights(logits, mask):
    return (torch.ones(logits.shape[0], dtype=torch.float64, device=logits.device) if mask is None
            else mask.double())


def ref_router_stats(logits, k, mask=None):
    """moe.router_stats in float64: counts [E], mean_probs [E], weight_sum []. The selection is moe.topk_renorm's
    (a stable descending sort: NaN first, ties to the lowest index); W = 0 gives mean_probs NaN (0/0)."""
    x = logits.double()
    w = bal_weights(x, mask)
    sel = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]
    picked = torch.zeros_like(x).scatter_(1, sel, 1.0)
    W = w.sum()
    return (picked * w[:, None]).sum(0), (bal_probs(x) * w[:, None]).sum(0) / W, W


def ref_load_balancing_loss(counts, probs, W):
    """Switch / transformers' load_balancing_loss_func from the statistics: E · Σ_e (counts_e / W) · P_e."""
    return counts.double().shape[0] * (counts.double() / W.double() * probs.double()).sum()


def ref_router_stats_grad(logits, mask, W, g):
    """(w_t / W) · p_te · (g_e - Σ_j p_tj g_j)."""
    x = logits.double()
    p = bal_probs(x)
    g = g.double()
    c = (p * g).sum(-1, keepdim=True)
    return (bal_weights(x, mask) / W.double())[:, None] * p * (g - c)


def ref_router_z_loss(logits):
    """mean_t lse_t² (NaN for T = 0, a row of -inf gives +inf)."""
    lse = torch.logsumexp(logits.double(), -1)
    return (lse * lse).mean()


def ref_router_z_loss_grad(logits, dloss):
    """dloss · (2 / T) · lse_t · softmax(x_t) (a row of -inf gives NaN, as PyTorch's autograd of logsumexp)."""
    x = logits.double()
    lse = torch.logsumexp(x, -1, keepdim=True)
    return dloss.double() * (2.0 / max(x.shape[0], 1)) * lse * torch.exp(x - lse)


#===----------------------------------------------------------------------===#
# Comparisons and cases
#===----------------------------------------------------------------------===#


#: The tolerance of the similarity cases whose operands are f16/bf16 of one type: they run the tensor-core kernel
#: (since the H100 run of 2026-11-24), whose probabilities enter the mixing product rounded to the operand type
#: (bf16: 8 bits), as in FlashAttention.
MMA_TOL = dict(rtol=1e-2, atol=2e-3)


def aot_options_of(manifest_path):
    """The pipeline_options moe-aot.py recorded in ``manifest_path`` ("" without a manifest or the field)."""
    import json

    if not manifest_path:
        return ""
    with open(manifest_path) as f:
        return json.load(f).get("pipeline_options", "")


def close(name, got, want, rtol=2e-4, atol=2e-5):
    got, want = got.float().cpu(), want.float().cpu()
    nan_ok = torch.equal(torch.isnan(got), torch.isnan(want))
    ok = nan_ok and torch.allclose(torch.nan_to_num(got), torch.nan_to_num(want), rtol=rtol, atol=atol)
    if not ok:
        diff = (torch.nan_to_num(got) - torch.nan_to_num(want)).abs().max().item()
        raise AssertionError(f"{name}: mismatch (max abs diff {diff}, NaN pattern equal: {nan_ok})")


def same(name, got, want):
    if not torch.equal(got.cpu().long(), want.cpu().long()):
        bad = (got.cpu().long() != want.cpu().long()).nonzero()[:5].tolist()
        raise AssertionError(f"{name}: differs at {bad}")


def check_topk(name, lib, fn, scores, k, mode, renorm):
    w, i = lib.call(fn, [scores], [(scores.shape[:-1] + (k,), torch.float32),
                                   (scores.shape[:-1] + (k,), torch.int32)])
    rw, ri = ref_topk(scores, k, mode, renorm)
    same(f"{name} indices", i, ri)
    close(f"{name} weights", w, rw)


def case_topk(lib, g):
    s = torch.randn(300, 16, generator=g).to(DEV)
    s[1] = 0.5                                   # all tied: indices 0, 1
    s[2] = NEG_INF                               # all masked: zeros, indices 0, 1
    s[3, 7] = float("nan")                       # NaN ranked first, weights NaN
    s[4, :] = NEG_INF
    s[4, 9] = 1.0                                # one finite logit
    s[5, 3] = s[5, 11] = 10.0                    # tie for the top
    s[6] = -0.0
    s[6, 2] = 0.0                                # -0 and +0 tie
    check_topk("topk_logits", lib, "topk_logits", s, 2, "logits", True)

    p = torch.rand(300, 256, generator=g).to(DEV).to(torch.bfloat16)   # ties are common in bf16
    check_topk("topk_probs_raw", lib, "topk_probs_raw", p, 8, "probs", False)

    s = torch.randn(300, 64, generator=g).to(DEV).to(torch.float16)
    s[0] = float("-inf")
    check_topk("topk_dense", lib, "topk_dense", s, 6, "logits", False)

    p = torch.rand(7, 5, 60, generator=g).to(DEV)
    p[0, 0] = 0.0                                # zero sum -> zero weights
    check_topk("topk_probs_renorm", lib, "topk_probs_renorm", p, 3, "probs", True)

    s = torch.randn(50, 1024, generator=g).to(DEV)
    check_topk("topk_k1024", lib, "topk_k1024", s, 40, "logits", True)

    s = torch.randn(40, 2048, generator=g).to(DEV)
    s[1, 100] = float("nan")
    s[2] = 3.0
    check_topk("topk_block", lib, "topk_block", s, 4, "logits", False)

    s = torch.randn(64, 16, generator=g).to(DEV)
    s[0] = NEG_INF                               # k = K over a masked row: zeros, indices 0..15
    s[1, ::2] = NEG_INF
    s[2] = 1.0                                   # all tied: indices in order
    check_topk("topk_k_eq_K", lib, "topk_k_eq_K", s, 16, "logits", True)

    p = torch.rand(1, 8, generator=g).to(DEV).half()   # a single token
    check_topk("topk_one_token", lib, "topk_one_token", p, 3, "probs", True)

    w, i = lib.call("topk_no_tokens", [torch.empty(0, 16, device=DEV)],
                    [((0, 2), torch.float32), ((0, 2), torch.int32)])
    if w.numel() or i.numel():
        raise AssertionError("topk_no_tokens: results are not empty")

    # topk-rounds=list's paths (its kernel where the library was built with it, else redux's): rows whose
    # best picks crowd into one lane's runs (a row sorted descending: the lists run out and refill),
    # ties across lanes (bf16, small integers), -inf and NaN rows, a row base 4 bytes off a 16-byte
    # boundary (a contiguous view one element into a buffer: the 4-byte-load path).
    def adversarial(x):
        return adversarial_rows(x, g)

    def misaligned(x):
        flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
        view = flat[1:].view(x.shape)
        view.copy_(x)
        return view

    # 6200 tokens: past the 6144 up to which topk-rounds=list-redux (the default on sm_80+) runs the redux kernel,
    # so these shapes check the list kernel and the cases above (300 tokens and fewer) the redux one.
    shapes = [("topk_shapes_160_bf16", (6200, 160), torch.bfloat16, 8, "logits", True),
              ("topk_shapes_288_k32", (6200, 288), torch.float32, 32, "logits", True),
              ("topk_shapes_384_f16", (6200, 384), torch.float16, 8, "probs", True),
              ("topk_shapes_896_dense", (6200, 896), torch.float32, 8, "logits", False),
              ("topk_shapes_100_raw", (6200, 100), torch.float32, 20, "probs", False),
              ("topk_shapes_62", (6200, 62), torch.float32, 5, "logits", True)]
    for fn, shape, dtype, k, mode, renorm in shapes:
        x = torch.randn(*shape, generator=g) if mode == "logits" else torch.rand(*shape, generator=g)
        x = adversarial(x.to(DEV).to(dtype))
        if mode == "probs":
            x = torch.nan_to_num(x, nan=float("nan"), neginf=0.0).abs()   # probabilities: >= 0, NaN kept
        check_topk(fn, lib, fn, x, k, mode, renorm)
        check_topk(f"{fn} (misaligned)", lib, fn, misaligned(x), k, mode, renorm)

    # The ambient stream: the call runs in the caller's (side) stream.
    if DEV == "cpu":
        return                                   # --cpu-dry-run: no streams
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        s = torch.randn(300, 16, generator=g).to("cuda")
        s[0] = s[0].flip(0)                      # an in-place edit just before the call
        check_topk("topk_logits (side stream)", lib, "topk_logits", s, 2, "logits", True)


def check_mix_topk(name, w, i, p_ref, k):
    rw, ri = ref_topk(p_ref, k, "probs", True)
    # Near-ties may order differently; compare the reference value at our index.
    got_vals = p_ref.gather(-1, i.long())
    close(f"{name} selected values", got_vals, p_ref.gather(-1, ri.long()), rtol=1e-4, atol=1e-6)
    close(f"{name} weights", w, rw, rtol=1e-4, atol=1e-5)


def case_similarity(lib, g):
    u = torch.randn(2, 100, 64, generator=g).to(DEV) * 0.3
    e = torch.softmax(torch.randn(2, 100, 16, generator=g), -1).to(DEV)
    (p,) = lib.call("sim_causal", [u, e], [((2, 100, 16), torch.float32)])
    ref = ref_similarity(u, e, tau=0.5, causal=True)
    close("sim_causal", p, ref)

    w, i = lib.call("sim_topk", [u, e], [((2, 100, 2), torch.float32), ((2, 100, 2), torch.int32)])
    check_mix_topk("sim_topk", w, i, ref, 2)

    u = (torch.randn(2, 70, 40, generator=g) * 0.5).to(torch.bfloat16).to(DEV)
    e = torch.softmax(torch.randn(2, 70, 24, generator=g), -1).to(DEV)
    ws = (torch.randn(40, 40, generator=g) * 0.2).to(DEV)
    m = (torch.rand(2, 70, generator=g) > 0.3).to(DEV)
    m[1] = False                                  # every key masked: p = 0
    (p,) = lib.call("sim_ws_mask", [u, e, ws, m], [((2, 70, 24), torch.float32)])
    close("sim_ws_mask", p, ref_similarity(u, e, tau=4.0, ws=ws, key_mask=m))

    u = (torch.randn(3, 33, 24, generator=g) * 0.4).half().to(DEV)
    e = torch.softmax(torch.randn(3, 33, 8, generator=g), -1).half().to(DEV)
    (p,) = lib.call("sim_plain_f16", [u, e], [((3, 33, 8), torch.float32)])
    close("sim_plain_f16", p, ref_similarity(u, e), **MMA_TOL)

    u = (torch.randn(2, 100, 64, generator=g) * 0.3).to(torch.bfloat16).to(DEV)
    e = torch.softmax(torch.randn(2, 100, 16, generator=g), -1).to(torch.bfloat16).to(DEV)
    (p,) = lib.call("sim_mma_bf16_causal", [u, e], [((2, 100, 16), torch.float32)])
    close("sim_mma_bf16_causal", p, ref_similarity(u, e, tau=0.5, causal=True), **MMA_TOL)
    # u one element into its buffer (a base not 16-byte aligned): the 16-byte and cp.async staging need an aligned
    # base, so the kernel stages its keys with the element loop, its values with 16-byte vectors.
    ua = torch.empty(u.numel() + 1, dtype=u.dtype, device=DEV)[1:].view_as(u)
    ua.copy_(u)
    (p,) = lib.call("sim_mma_bf16_causal", [ua, e], [((2, 100, 16), torch.float32)])
    close("sim_mma_bf16_causal (u misaligned)", p, ref_similarity(u, e, tau=0.5, causal=True), **MMA_TOL)

    # D = 256, K = 64 over three key tiles of 64 (or five of 32).
    u = (torch.randn(2, 150, 256, generator=g) * 0.2).to(torch.bfloat16).to(DEV)
    e = torch.softmax(torch.randn(2, 150, 64, generator=g), -1).to(torch.bfloat16).to(DEV)
    (p,) = lib.call("sim_mma_bf16_causal_d256", [u, e], [((2, 150, 64), torch.float32)])
    close("sim_mma_bf16_causal_d256", p, ref_similarity(u, e, tau=2.0, causal=True), **MMA_TOL)

    u = (torch.randn(2, 70, 40, generator=g) * 0.4).half().to(DEV)
    e = torch.softmax(torch.randn(2, 70, 12, generator=g), -1).half().to(DEV)
    m = (torch.rand(2, 70, generator=g) > 0.3).to(DEV)
    m[1] = False                                  # every key masked: p = 0
    (p,) = lib.call("sim_mma_f16_mask", [u, e, m], [((2, 70, 12), torch.float32)])
    close("sim_mma_f16_mask", p, ref_similarity(u, e, key_mask=m), **MMA_TOL)

    # Three key tiles of 64 with a key mask and K = 16: the masked values' synchronous 16-byte staging into the next
    # buffer while the keys come by cp.async (it once wrote the buffer being read).
    u = (torch.randn(2, 150, 64, generator=g) * 0.2).bfloat16().to(DEV)
    e = torch.softmax(torch.randn(2, 150, 16, generator=g), -1).bfloat16().to(DEV)
    m = (torch.rand(2, 150, generator=g) > 0.3).to(DEV)
    m[1, :64] = False                             # a whole tile masked in one element
    (p,) = lib.call("sim_mma_bf16_mask_k16", [u, e, m], [((2, 150, 16), torch.float32)])
    close("sim_mma_bf16_mask_k16", p, ref_similarity(u, e, key_mask=m), **MMA_TOL)

    u = torch.randn(2, 45, 16, generator=g).to(DEV)
    e = torch.softmax(torch.randn(2, 45, 8, generator=g), -1).to(DEV)
    m = (torch.rand(2, 45, generator=g) > 0.5).to(DEV)
    m[0, 0] = False                               # query 0 sees only key 0: masked -> p = 0
    m[1, :5] = False
    (p,) = lib.call("sim_causal_mask", [u, e, m], [((2, 45, 8), torch.float32)])
    close("sim_causal_mask", p, ref_similarity(u, e, tau=0.25, causal=True, key_mask=m))

    u = torch.randn(1, 1, 8, generator=g).to(DEV)
    e = torch.softmax(torch.randn(1, 1, 4, generator=g), -1).to(DEV)
    (p,) = lib.call("sim_one", [u, e], [((1, 1, 4), torch.float32)])
    close("sim_one", p, e)                        # one token: it mixes only itself


def ref_similarity_grads(u, e, dp, tau=1.0, causal=False, ws=None, key_mask=None):
    """(du, de[, dws]): float64 autograd of ref_similarity's formulation, with the masked-row guards moved out of
    the graph (the row max detached, a zero sum divided by 1) so that a fully masked row gets 0, not NaN."""
    u = u.double().requires_grad_()
    e = e.double().requires_grad_()
    w = ws.double().requires_grad_() if ws is not None else None
    logits = similarity_logits(u, tau, causal, w, key_mask)
    m = logits.amax(-1, keepdim=True).detach()
    p = torch.exp(logits - torch.where(m == NEG_INF, torch.zeros_like(m), m))
    s = p.sum(-1, keepdim=True)
    out = (p / torch.where(s == 0, torch.ones_like(s), s)) @ e
    leaves = [u, e] + ([w] if w is not None else [])
    return torch.autograd.grad(out, leaves, dp.double())


def check_similarity_grad(name, lib, fn, u, e, dp, ws=None, key_mask=None, tau=1.0, causal=False, scaled_rtol=None):
    """Against float64 autograd; `scaled_rtol`: within that fraction of each gradient's largest magnitude (the
    tensor-core passes of flash-mma-grad round P, dX and dp to the operand type), else close()'s 1e-3."""
    B, N, D = u.shape
    args = [u, e] + ([ws] if ws is not None else []) + ([key_mask] if key_mask is not None else []) + [dp]
    shapes = [((B, N, D), torch.float32), (tuple(e.shape), torch.float32)]
    if ws is not None:
        shapes.append(((D, D), torch.float32))
    got = lib.call(fn, args, shapes)
    want = ref_similarity_grads(u, e, dp, tau, causal, ws, key_mask)
    for label, g, w in zip(("du", "de", "dws"), got, want):
        if scaled_rtol:
            close_scaled(f"{name} {label}", g, w, rtol=scaled_rtol)
        else:
            close(f"{name} {label}", g, w, rtol=1e-3, atol=1e-4)
    return got


def check_mma_topk(name, w, i, p_ref, k, renorm):
    """The fused top-k of an f16/bf16 similarity case: every index an expert (never one of the padding columns
    past K) selected once, the reference's values at our indices and our weights within MMA_TOL of the
    reference's (near-ties may order differently; exact ties are the caller's to check)."""
    K = p_ref.shape[-1]
    il = i.long()
    if ((il < 0) | (il >= K)).any():
        raise AssertionError(f"{name}: an index outside [0, {K}) (a padded expert)")
    srt = il.sort(-1).values
    if (srt[..., 1:] == srt[..., :-1]).any():
        raise AssertionError(f"{name}: an expert selected twice")
    rw, ri = ref_topk(p_ref, k, "probs", renorm)
    close(f"{name} selected values", p_ref.gather(-1, il), p_ref.gather(-1, ri.long()), **MMA_TOL)
    close(f"{name} weights", w, rw, **MMA_TOL)
    return rw, ri


def case_similarity_topk_mma(lib, g):
    """similarity_inform_topk on f16/bf16 operands of one type: the tensor-core kernel, which selects from the
    mma.sync accumulators (a row's experts spread over the 4 lanes of a quad), or with split keys the top-k combine
    (a quad of lanes a row). It must follow the op's rules exactly: ties to the lowest index, NaN first, never a
    padded expert, rows past N (100, 70: not multiples of the 64- or 128-row block) stored nowhere (memcheck)."""
    # f16, k = 3, a key mask. Experts 2 and 5 have equal e columns above every other expert's (so every kernel
    # computes equal p for them, on top); sequence 1 has a NaN at expert 9 of an unmasked key (every row's p_9 is
    # NaN: picked first, every weight NaN); sequence 2 has every key masked (p = 0: indices 0, 1, 2, weights 0).
    B, N, D, K = 3, 100, 64, 16
    u = (torch.randn(B, N, D, generator=g) * 0.3).half()
    e = 0.3 * torch.softmax(torch.randn(B, N, K, generator=g) * 0.5, -1)
    e[..., 2] = 0.25 + 0.1 * torch.rand(B, N, generator=g)
    e = e.half()
    e[..., 5] = e[..., 2]
    e[1, 7, 9] = float("nan")
    m = torch.rand(B, N, generator=g) > 0.3
    m[1, 7] = True
    m[2] = False
    u, e, m = u.to(DEV), e.to(DEV), m.to(DEV)
    w, i = lib.call("sim_topk_mma_f16", [u, e, m], [((B, N, 3), torch.float32), ((B, N, 3), torch.int32)])
    check_mma_topk("sim_topk_mma_f16", w, i, ref_similarity(u, e, key_mask=m), 3, True)
    i = i.cpu()
    same("sim_topk_mma_f16 tie (2 before 5)", i[0, :, :2], torch.tensor([2, 5]).expand(N, 2))
    same("sim_topk_mma_f16 NaN first", i[1], torch.tensor([9, 2, 5]).expand(N, 3))
    if not torch.isnan(w[1]).all():
        raise AssertionError("sim_topk_mma_f16: a weight of a row with a NaN probability is not NaN")
    same("sim_topk_mma_f16 masked element", i[2], torch.tensor([0, 1, 2]).expand(N, 3))
    close("sim_topk_mma_f16 masked element weights", w[2], torch.zeros(N, 3), rtol=0, atol=0)

    # bf16, causal, k = K = 12 (the tiles pad the experts to 16 with p = 0), raw probabilities. Expert 11 has
    # e = 0 (p = 0 exactly: last in every row, and the padding's zeros never before it), 2 and 5 tied; row 0 sees
    # key 0 alone, so p = e_0 exactly in every kernel: with e_0 of a few levels (many ties) its whole order and
    # its weights must equal the reference's exactly.
    B, N, D, K = 2, 70, 40, 12
    u = (torch.randn(B, N, D, generator=g) * 0.4).to(torch.bfloat16)
    e = torch.softmax(torch.randn(B, N, K, generator=g), -1)
    e[:, 0] = torch.randint(1, 4, (B, K), generator=g) / 16.0
    e[..., 11] = 0.0
    e = e.to(torch.bfloat16)
    e[..., 5] = e[..., 2]
    u, e = u.to(DEV), e.to(DEV)
    w, i = lib.call("sim_topk_mma_bf16_kK", [u, e], [((B, N, K), torch.float32), ((B, N, K), torch.int32)])
    rw, ri = check_mma_topk("sim_topk_mma_bf16_kK", w, i, ref_similarity(u, e, tau=0.5, causal=True), K, False)
    i, ri = i.cpu().long(), ri.cpu().long()
    same("sim_topk_mma_bf16_kK zero expert last", i[..., -1], torch.full((B, N), 11))
    pos = i.argsort(-1)
    if not (pos[..., 2] < pos[..., 5]).all():
        raise AssertionError("sim_topk_mma_bf16_kK: tied experts 2 and 5 not in index order")
    same("sim_topk_mma_bf16_kK row 0 (exact ties)", i[:, 0], ri[:, 0])
    close("sim_topk_mma_bf16_kK row 0 weights", w[:, 0], rw[:, 0], rtol=0, atol=0)


def case_similarity_grad(lib, g):
    # causal, N = 67 (not a multiple of the 16-row or 32-column tiles), D = 40 (two feature chunks)
    u = (torch.randn(2, 67, 40, generator=g) * 0.3).to(DEV)
    e = torch.softmax(torch.randn(2, 67, 16, generator=g), -1).to(DEV)
    dp = torch.randn(2, 67, 16, generator=g).to(DEV)
    check_similarity_grad("simgrad_causal", lib, "simgrad_causal", u, e, dp, tau=0.5, causal=True)

    # ws and a key mask; a sequence with every key masked passes no gradient; K = 24 is not a multiple of 8
    u = (torch.randn(2, 70, 40, generator=g) * 0.5).to(torch.bfloat16).to(DEV)
    e = torch.softmax(torch.randn(2, 70, 24, generator=g), -1).to(DEV)
    ws = (torch.randn(40, 40, generator=g) * 0.2).to(DEV)
    m = (torch.rand(2, 70, generator=g) > 0.3).to(DEV)
    m[1] = False
    dp = torch.randn(2, 70, 24, generator=g).to(DEV)
    du, de, _ = check_similarity_grad("simgrad_ws_mask", lib, "simgrad_ws_mask", u, e, dp, ws=ws, key_mask=m,
                                      tau=4.0)
    if du[1].abs().max().item() != 0 or de[1].abs().max().item() != 0:
        raise AssertionError("simgrad_ws_mask: a fully masked sequence got a gradient")

    # causal + mask: query 0 sees only key 0, masked (a fully masked row); the first keys masked
    u = torch.randn(2, 45, 16, generator=g).to(DEV)
    e = torch.softmax(torch.randn(2, 45, 8, generator=g), -1).to(DEV)
    m = (torch.rand(2, 45, generator=g) > 0.5).to(DEV)
    m[0, 0] = False
    m[1, :5] = False
    dp = torch.randn(2, 45, 8, generator=g).to(DEV)
    du, de = check_similarity_grad("simgrad_causal_mask", lib, "simgrad_causal_mask", u, e, dp, key_mask=m,
                                   tau=0.25, causal=True)
    if de[0, 0].abs().max().item() != 0:
        raise AssertionError("simgrad_causal_mask: a masked key got a value gradient")

    # one token: p = e, so de = dp and du = 0
    u = torch.randn(1, 1, 8, generator=g).to(DEV)
    e = torch.softmax(torch.randn(1, 1, 4, generator=g), -1).to(DEV)
    dp = torch.randn(1, 1, 4, generator=g).to(DEV)
    du, de = check_similarity_grad("simgrad_one", lib, "simgrad_one", u, e, dp)
    close("simgrad_one de = dp", de, dp)

    # K = 256 (the kernel's limit), f16 u, ws, causal
    u = (torch.randn(1, 33, 24, generator=g) * 0.5).half().to(DEV)
    e = torch.softmax(torch.randn(1, 33, 256, generator=g), -1).to(DEV)
    ws = (torch.randn(24, 24, generator=g) * 0.3).to(DEV)
    dp = torch.randn(1, 33, 256, generator=g).to(DEV)
    check_similarity_grad("simgrad_k256", lib, "simgrad_k256", u, e, dp, ws=ws, causal=True)

    # f16/bf16 u and e without ws: the tensor-core passes where the library was built with flash-mma-grad (the
    # scalar ones otherwise), each gradient within 3% of its largest magnitude. bf16, causal + key mask, 4 row
    # blocks (a partial last), query 0 without a key, a sequence with every key masked
    def masked_bf16_grad(name, N, D, K, scale, tau):
        u = (torch.randn(2, N, D, generator=g) * scale).to(torch.bfloat16).to(DEV)
        e = torch.softmax(torch.randn(2, N, K, generator=g), -1).to(torch.bfloat16).to(DEV)
        m = (torch.rand(2, N, generator=g) > 0.3).to(DEV)
        m[0, 0] = False
        m[1] = False
        dp = torch.randn(2, N, K, generator=g).to(DEV)
        du, de = check_similarity_grad(name, lib, name, u, e, dp, key_mask=m, tau=tau, causal=True,
                                       scaled_rtol=3e-2)
        if du[1].abs().max().item() != 0 or de[1].abs().max().item() != 0:
            raise AssertionError(f"{name}: a fully masked sequence got a gradient")

    masked_bf16_grad("simgrad_mma_bf16", 200, 64, 16, 0.3, 0.5)
    # f16, the widest the tensor-core passes take (D = 128, K = 64), dynamic N, a row block past a column tile
    u = (torch.randn(1, 75, 128, generator=g) * 0.4).half().to(DEV)
    e = torch.softmax(torch.randn(1, 75, 64, generator=g), -1).half().to(DEV)
    dp = torch.randn(1, 75, 64, generator=g).to(DEV)
    check_similarity_grad("simgrad_mma_f16_wide", lib, "simgrad_mma_f16_wide", u, e, dp, tau=2.0, scaled_rtol=3e-2)
    # bf16 past 128 features (D = 256, K = 64: dq's and du's features split over two blocks, cp.async tiles),
    # the same masks, dynamic N over three row blocks (a partial last)
    masked_bf16_grad("simgrad_mma_bf16_d256", 150, 256, 64, 0.15, 2.0)


def attention_inputs(g):
    B, H, N, Nk, D, Dh = 2, 4, 50, 60, 32, 8
    s = torch.randn(B, H, N, Nk, generator=g) * 2
    s[0, 1] *= 4                                  # a sharper head
    s[1, :, 3, :] = NEG_INF                       # a masked query row
    s[1, 2, :, 10:] = NEG_INF
    u = torch.randn(B, N, D, generator=g) * 0.5
    v = torch.randn(B, H, Nk, Dh, generator=g) * 0.1
    wo = torch.randn(D, H * Dh, generator=g) * 0.1
    e = torch.softmax(torch.randn(B, Nk, 16, generator=g), -1)
    return [t.to(DEV) for t in (s, u, v, wo, e)]


def case_attention(lib, g):
    s, u, v, wo, e = attention_inputs(g)
    p, h = lib.call("attn", [s, u, v, wo, e], [((2, 50, 16), torch.float32), ((2,), torch.int32)])
    rp, rh = ref_attention(s, u, v, wo, e, sigma=2.0)
    same("attn head", h, rh)
    close("attn p", p, rp)
    w, i, h2 = lib.call("attn_topk", [s, u, v, wo, e],
                        [((2, 50, 2), torch.float32), ((2, 50, 2), torch.int32), ((2,), torch.int32)])
    same("attn_topk head", h2, rh)
    check_mix_topk("attn_topk", w, i, rp, 2)

    ins = [t.bfloat16() for t in attention_inputs(g)]
    p, h = lib.call("attn_bf16", ins, [((2, 50, 16), torch.float32), ((2,), torch.int32)])
    rp, rh = ref_attention(*ins, sigma=2.0, head_scale=1.0)
    same("attn_bf16 head", h, rh)
    # The tensor-core kernel (u and e bf16): the means and the probabilities enter the products rounded to bf16.
    close("attn_bf16 p", p, rp, **MMA_TOL)


def attention_mma_inputs(g, B, H, N, Nk, D, Dh, K, dtype, sharp):
    """attention_posterior inputs in `dtype`: head sharp[b] of sequence b sharper than the others (the min-entropy
    head, not head 0, so the added scores are read at a head offset), key 7 masked (-inf) in every head and row,
    keys 30..39 of sequence 1 masked, query row 5 of sequence 1 fully masked (p = 0). |m_j| about 1, so u.m / sigma^2
    stays O(1): the means' rounding to the operand type moves a logit by about 2^-8 of that."""
    s = torch.randn(B, H, N, Nk, generator=g) * 2
    for b, h in enumerate(sharp):
        s[b, h] *= 4
    s[..., 7] = NEG_INF
    s[1, :, :, 30:40] = NEG_INF
    s[1, :, 5, :] = NEG_INF
    u = torch.randn(B, N, D, generator=g) * 0.3
    v = torch.randn(B, H, Nk, Dh, generator=g) * 0.5
    wo = torch.randn(D, H * Dh, generator=g) / (H * (Dh * D) ** 0.5) * 2
    e = torch.softmax(torch.randn(B, Nk, K, generator=g), -1)
    return [t.to(dtype).to(DEV) for t in (s, u, v, wo, e)]


def case_attention_mma(lib, g):
    """attention_posterior(_topk) on f16/bf16 u and e: the tensor-core kernel (the per-key bias and the chosen head's
    scores added to the logits' C fragments; the means rounded to the operand type: MMA_TOL). N = 100 / 70 (rows
    past N in the last 64-row block: stored nowhere, memcheck), Nk = 70 / 45 (a partial last key tile), masked keys,
    a fully masked row, the head chosen by min entropy (2 and 1, not 0)."""
    B, H, N, Nk, D, Dh, K = 2, 4, 100, 70, 64, 16, 16
    ins = attention_mma_inputs(g, B, H, N, Nk, D, Dh, K, torch.float16, (2, 1))
    p, h = lib.call("attn_mma_f16", ins, [((B, N, K), torch.float32), ((B,), torch.int32)])
    rp, rh = ref_attention(*ins, sigma=2.0)
    same("attn_mma_f16 head", h, rh)
    same("attn_mma_f16 head is (2, 1)", rh, torch.tensor([2, 1]))
    close("attn_mma_f16 p", p, rp, **MMA_TOL)
    close("attn_mma_f16 masked row", p[1, 5], torch.zeros(K), rtol=0, atol=0)

    B2, N2, Nk2, D2, Dh2, K2 = 2, 70, 45, 40, 8, 12
    ins2 = attention_mma_inputs(g, B2, H, N2, Nk2, D2, Dh2, K2, torch.bfloat16, (1, 3))
    p, h = lib.call("attn_mma_bf16", ins2, [((B2, N2, K2), torch.float32), ((B2,), torch.int32)])
    rp2, rh2 = ref_attention(*ins2, sigma=1.5, head_scale=1.0)
    same("attn_mma_bf16 head", h, rh2)
    same("attn_mma_bf16 head is (1, 3)", rh2, torch.tensor([1, 3]))
    close("attn_mma_bf16 p", p, rp2, **MMA_TOL)

    # The fused top-k (k = 3) on the f16 inputs with experts 2 and 5 tied above the others (equal e columns above
    # every other expert's in every key, so every kernel computes equal p for them, on top): 2 before 5 in every
    # row with keys; the fully masked row: 0, 1, 2 and zero weights.
    s, u, v, wo, e = ins
    e = 0.3 * e.float()
    e[..., 2] = 0.35 + 0.1 * torch.rand(B, Nk, generator=g).to(DEV)
    e = e.half()
    e[..., 5] = e[..., 2]
    w, i, h = lib.call("attn_topk_mma_f16", [s, u, v, wo, e],
                       [((B, N, 3), torch.float32), ((B, N, 3), torch.int32), ((B,), torch.int32)])
    rp3, rh3 = ref_attention(s, u, v, wo, e, sigma=2.0)
    same("attn_topk_mma_f16 head", h, rh3)
    check_mma_topk("attn_topk_mma_f16", w, i, rp3, 3, True)
    i = i.cpu()
    rows = torch.ones(B, N, dtype=torch.bool)
    rows[1, 5] = False
    same("attn_topk_mma_f16 tie (2 before 5)", i[rows][:, :2], torch.tensor([2, 5]).expand(int(rows.sum()), 2))
    same("attn_topk_mma_f16 masked row", i[1, 5], torch.tensor([0, 1, 2]))
    close("attn_topk_mma_f16 masked row weights", w[1, 5], torch.zeros(3), rtol=0, atol=0)


def ref_attention_grads(scores, u, v, wo, e, dp, head, sigma=1.0, head_scale=None):
    """(d_scores, du, dv, dwo, de): float64 autograd of ref_attention's posterior at the given heads h* (nothing
    flows through the choice), with the masked-row guards moved out of the graph as in ref_similarity_grads."""
    leaves = [t.double().requires_grad_() for t in (scores, u, v, wo, e)]
    s, uu, vv, w, ee = leaves
    H, Dh = s.shape[1], vv.shape[-1]
    hs = float(H) if head_scale is None else head_scale
    out = []
    for b in range(s.shape[0]):
        h = int(head[b])
        m = hs * vv[b, h] @ w[:, h * Dh:(h + 1) * Dh].t()
        logits = s[b, h] + uu[b] @ m.t() / sigma ** 2 - (m * m).sum(-1) / (2 * sigma ** 2)
        mx = logits.amax(-1, keepdim=True).detach()
        p = torch.exp(logits - torch.where(mx == NEG_INF, torch.zeros_like(mx), mx))
        z = p.sum(-1, keepdim=True)
        out.append((p / torch.where(z == 0, torch.ones_like(z), z)) @ ee[b])
    return torch.autograd.grad(torch.stack(out), leaves, dp.double())


def check_attention_grad(name, lib, fn, ins, head, dp, sigma=1.0, head_scale=None, rtol=1e-3, atol=1e-4):
    shapes = [(tuple(t.shape), torch.float32) for t in ins]
    got = lib.call(fn, list(ins) + [head, dp], shapes)
    want = ref_attention_grads(*ins, dp, head.cpu(), sigma, head_scale)
    for label, a, b in zip(("d_scores", "du", "dv", "dwo", "de"), got, want):
        close(f"{name} {label}", a, b, rtol=rtol, atol=atol)
    ds = got[0].cpu()
    for b in range(ds.shape[0]):                  # d_scores is 0 off the chosen head
        off = torch.ones(ds.shape[1], dtype=torch.bool)
        off[int(head[b])] = False
        if ds[b, off].abs().max().item() != 0:
            raise AssertionError(f"{name}: d_scores is not 0 off the head h* of sequence {b}")
    return got


def case_attention_grad(lib, g):
    # attention_inputs: masked keys (-inf scores on head 2 of sequence 1) and a fully masked query row (row 3 of
    # sequence 1); N = 50, Nk = 60: not multiples of the 16-row / 32-column tiles; h* from the forward reference
    ins = attention_inputs(g)
    _, head = ref_attention(*ins, sigma=2.0)
    dp = torch.randn(2, 50, 16, generator=g).to(DEV)
    got = check_attention_grad("apgrad", lib, "apgrad", ins, head, dp, sigma=2.0)
    if got[0][1, :, 3].abs().max().item() != 0 or got[1][1, 3].abs().max().item() != 0:
        raise AssertionError("apgrad: the fully masked row got a gradient")

    # bf16 operands, head_scale 1; h* = 2 in sequence 1: the head with the masked keys
    ins = [t.bfloat16() for t in attention_inputs(g)]
    head = torch.tensor([1, 2], dtype=torch.int32).to(DEV)
    dp = torch.randn(2, 50, 16, generator=g).to(DEV)
    got = check_attention_grad("apgrad_bf16", lib, "apgrad_bf16", ins, head, dp, sigma=2.0, head_scale=1.0,
                               rtol=2e-3, atol=2e-4)
    if got[0][1, 2, :, 10:].abs().max().item() != 0:
        raise AssertionError("apgrad_bf16: a masked key got a score gradient")

    # one query, Nk = 33 (one key past a column tile), a masked key, h* = 1
    s = torch.randn(1, 2, 1, 33, generator=g)
    s[0, 1, 0, 5] = NEG_INF
    ins = [t.to(DEV) for t in (s, torch.randn(1, 1, 12, generator=g) * 0.5, torch.randn(1, 2, 33, 4, generator=g) * 0.3,
                               torch.randn(12, 8, generator=g) * 0.3,
                               torch.softmax(torch.randn(1, 33, 8, generator=g), -1))]
    dp = torch.randn(1, 1, 8, generator=g).to(DEV)
    check_attention_grad("apgrad_one", lib, "apgrad_one", ins, torch.tensor([1], dtype=torch.int32).to(DEV), dp,
                         sigma=0.5)
    case_attention_grad_bad_head(lib, g)


def case_attention_grad_bad_head(lib, g):
    # h* outside [0, H = 4) (H in sequence 1, -1 in sequence 0): checked by the kernels (no host sync), reported
    # through moeTakeError (op code 4) and the sequence skipped: its gradients are 0 and it adds nothing to d_wo,
    # so the other sequence's are those of a batch without it.
    lib.cpu.moeSetErrorEcho(0)
    ins = attention_inputs(g)
    dp = torch.randn(2, 50, 16, generator=g).to(DEV)
    shapes = [(tuple(t.shape), torch.float32) for t in ins]
    for bad_b, bad in ((1, 4), (0, -1)):
        head = torch.tensor([2, 1], dtype=torch.int32)
        head[bad_b] = bad
        got = lib.call("apgrad", list(ins) + [head.to(DEV), dp], shapes)
        err = lib.take_error()
        want_err = f"moe.attention_posterior_grad: 'head' element {bad_b} is {bad}, outside [0, 4)"
        if not err or want_err not in err:
            raise AssertionError(f"apgrad: expected the index error {want_err!r}, got {err!r}")
        if not lib.results_after_error:
            continue
        k = 1 - bad_b
        s, u, v, wo, e = ins
        want = ref_attention_grads(s[k:k + 1], u[k:k + 1], v[k:k + 1], wo, e[k:k + 1], dp[k:k + 1],
                                   head[k:k + 1], 2.0)
        for i, label in enumerate(("d_scores", "du", "dv", "dwo", "de")):
            if label == "dwo":
                close(f"apgrad h*={bad} dwo (sequence {bad_b} skipped)", got[i], want[i], rtol=1e-3, atol=1e-4)
                continue
            close(f"apgrad h*={bad} {label} of sequence {k}", got[i][k], want[i][0], rtol=1e-3, atol=1e-4)
            if got[i][bad_b].abs().max().item() != 0:
                raise AssertionError(f"apgrad h*={bad}: {label} of the skipped sequence {bad_b} is not 0")


def case_mad(lib, g):
    x = torch.randn(500, 40, generator=g).to(DEV)
    a = torch.randint(0, 7, (500,), generator=g).int().to(DEV)   # cluster 7 empty
    a[:3] = 6
    a[a == 5] = 4
    a[10] = 5                                                   # a singleton cluster
    w, c = lib.call("mad", [x, a], [((8, 40), torch.float32), ((8,), torch.int32)])
    rw, rc = ref_mad(x, a, 8)
    same("mad counts", c, rc)
    close("mad weights", w, rw, rtol=1e-3, atol=1e-4)

    a64 = a.long()
    w, c = lib.call("mad_var", [x, a64], [((8, 40), torch.float32), ((8,), torch.int32)])
    rw, rc = ref_mad(x, a64, 8, normalize="expert", measure="variance", empty="raw")
    same("mad_var counts", c, rc)
    close("mad_var weights", w, rw, rtol=1e-3, atol=1e-4)

    # An out-of-range assign is skipped and reported through moeTakeError.
    lib.cpu.moeSetErrorEcho(0)
    bad = a.clone()
    bad[17] = 8
    w, c = lib.call("mad", [x, bad], [((8, 40), torch.float32), ((8,), torch.int32)])
    err = lib.take_error()
    if not err or "element 17 is 8" not in err:
        raise AssertionError(f"mad: expected an index error for element 17, got {err!r}")
    keep = torch.ones(500, dtype=torch.bool)
    keep[17] = False
    if lib.results_after_error:
        _, rc = ref_mad(x[keep.to(DEV)], bad[keep.to(DEV)], 8)
        same("mad counts (bad element skipped)", c, rc)
    case_mad_more(lib, g)


def case_mad_more(lib, g):
    x = torch.randn(300, 24, generator=g).half().to(DEV)
    a = torch.randint(0, 5, (300,), generator=g).int().to(DEV)   # cluster 5 empty
    w, c = lib.call("mad_global", [x, a], [((6, 24), torch.float32), ((6,), torch.int32)])
    rw, rc = ref_mad(x, a, 6, eps=1e-3, clip=0.0, normalize="global")
    same("mad_global counts", c, rc)
    close("mad_global weights", w, rw, rtol=1e-3, atol=1e-4)


def case_adjacency(lib, g):
    a = torch.rand(16, 16, generator=g).to(DEV)
    idx = torch.randint(0, 16, (300, 3), generator=g).int().to(DEV)
    idx[0] = torch.tensor([4, 4, 4])                 # repeated: counts once
    (n,) = lib.call("adj_row", [a, idx], [((16, 16), torch.float32)])
    close("adj_row", n, ref_adjacency(a, idx))
    idx2 = idx.clone()
    idx2[idx2 == 15] = 14                            # expert 15 never chosen
    (n,) = lib.call("adj_col", [a, idx2], [((16, 16), torch.float32)])
    close("adj_col", n, ref_adjacency(a, idx2, beta=0.5, norm="col", include_self=False))
    lib.cpu.moeSetErrorEcho(0)
    bad = idx.clone()
    bad[5, 1] = -3
    lib.call("adj_row", [a, bad], [((16, 16), torch.float32)])
    err = lib.take_error()
    if not err or "element 16 is -3" not in err:
        raise AssertionError(f"adj_row: expected an index error for element 16, got {err!r}")

    a = torch.rand(8, 8, generator=g).half().to(DEV)
    idx = torch.randint(0, 8, (100, 2), generator=g).to(DEV)     # int64
    (n,) = lib.call("adj_none", [a, idx], [((8, 8), torch.float32)])
    close("adj_none", n, ref_adjacency(a, idx, beta=0.25, norm="none"))


def case_hyper(lib, g):
    emb = torch.randn(32, generator=g).to(DEV)
    w1 = torch.randn(48, 32, generator=g).to(DEV) * 0.2
    b1 = torch.randn(48, generator=g).to(DEV)
    w2 = torch.randn(168, 48, generator=g).to(DEV) * 0.2
    b2 = torch.randn(168, generator=g).to(DEV)
    w, b = lib.call("hyper", [emb, w1, b1, w2, b2], [((8, 20), torch.float32), ((8,), torch.float32)])
    rw, rb = ref_hyper(emb, w1, b1, w2, b2, 8)
    close("hyper w", w, rw)
    close("hyper b", b, rb)

    ins = [torch.randn(16, generator=g), torch.randn(24, 16, generator=g) * 0.3, torch.randn(24, generator=g),
           torch.randn(36, 24, generator=g) * 0.3, torch.randn(36, generator=g)]
    ins = [t.bfloat16().to(DEV) for t in ins]
    w, b = lib.call("hyper_bf16", ins, [((4, 8), torch.float32), ((4,), torch.float32)])
    rw, rb = ref_hyper(*ins, 4)
    close("hyper_bf16 w", w, rw, rtol=1e-3, atol=1e-4)
    close("hyper_bf16 b", b, rb, rtol=1e-3, atol=1e-4)


def case_hyper_grad(lib, g):
    # Dh = 250, De = 40: a tail in every row chunk and two column passes per thread; w2 has 1616 rows (26 blocks
    # of 64 with a ragged last one); hidden unit 0 at a = 0 exactly (gradient 0), unit 1 NaN (passes dh), unit 2
    # negative (gradient 0).
    De, Dh, E, D = 40, 250, 16, 100
    emb = torch.randn(De, generator=g)
    w1 = torch.randn(Dh, De, generator=g) / De ** 0.5
    b1 = torch.randn(Dh, generator=g)
    w1[0] = 0.0
    b1[0] = 0.0
    b1[1] = float("nan")
    b1[2] = -100.0
    w2 = torch.randn(E * (D + 1), Dh, generator=g) / Dh ** 0.5
    b2 = torch.randn(E * (D + 1), generator=g)
    dw, db = torch.randn(E, D, generator=g), torch.randn(E, generator=g)
    ins = [t.to(DEV) for t in (emb, w1, b1, w2, b2, dw, db)]
    shapes = [(De,), (Dh, De), (Dh,), (E * (D + 1), Dh), (E * (D + 1),)]
    got = lib.call("hyper_grad", ins, [(s, torch.float32) for s in shapes])
    want = ref_hyper_grad(*ins, E)
    # dh sums E·(D+1) = 1616 f32 products, d_emb Dh = 250: atol covers sqrt(n)·eps-sized differences of sums
    # whose terms are O(1); outer products and d_b2 are one rounding.
    for name, a, b, atol in zip(("d_emb", "d_w1", "d_b1", "d_w2", "d_b2"), got, want, (1e-4, 1e-4, 1e-4, 2e-5, 0)):
        close(f"hyper_grad {name}", a, b, rtol=2e-4, atol=atol)
    db1, dw2 = got[2].cpu(), got[3].cpu()
    if db1[0] != 0 or db1[2] != 0 or not (torch.isfinite(db1[1]) and db1[1] != 0) or not dw2[:, 1].isnan().all():
        raise AssertionError("hyper_grad: the ReLU's edge (a = 0 and a < 0: no gradient; a NaN unit passes dh "
                             "and makes its d_w2 column NaN) is wrong")

    # A frozen hypernetwork (d_w1, d_w2 not returned), bf16 operands, dynamic shapes: E = 4, D = 7, Dh = 33.
    De, Dh, E, D = 16, 33, 4, 7
    ins = [torch.randn(De, generator=g), torch.randn(Dh, De, generator=g) * 0.3, torch.randn(Dh, generator=g),
           torch.randn(E * (D + 1), Dh, generator=g) * 0.3, torch.randn(E * (D + 1), generator=g)]
    ins = [t.bfloat16().to(DEV) for t in ins] + [torch.randn(E, D, generator=g).to(DEV),
                                                 torch.randn(E, generator=g).to(DEV)]
    got = lib.call("hyper_grad_frozen_bf16", ins, [((De,), torch.float32), ((Dh,), torch.float32),
                                                    ((E * (D + 1),), torch.float32)])
    want = ref_hyper_grad(*ins, E)
    for name, a, b in zip(("d_emb", "d_b1", "d_b2"), got, (want[0], want[2], want[4])):
        close(f"hyper_grad_frozen_bf16 {name}", a, b, rtol=2e-4, atol=1e-4)


def check_route(name, lib, fn, logits, bias, k, exact=False, **attrs):
    args = [logits] + ([bias] if bias is not None else [])
    T = logits.shape[0]
    w, i = lib.call(fn, args, [((T, k), torch.float32), ((T, k), torch.int32)])
    err = lib.take_error()
    if err:
        raise AssertionError(f"{name}: the call failed: {err}")
    route_matches(name, logits, bias, k, w, i, exact, **attrs)


def route_matches(name, logits, bias, k, w, i, exact=False, **attrs):
    """A route's weights w and indices i against the float64 reference (check_route's rule)."""
    rw, ri, rc = ref_route(logits, bias, k, **attrs)
    if exact:
        same(f"{name} indices", i, ri)
    else:
        # Near-ties of the f32 choice values may order differently from float64: compare the reference's choice
        # value at our index, then the weights of the reference at our picks.
        c_ours = ref_route(logits, bias, logits.shape[-1], **dict(attrs, renormalize=False, scale=1.0))
        full_c = torch.full(logits.shape, float("nan"), dtype=torch.float64)
        full_c.scatter_(1, c_ours[1].long().cpu(), c_ours[2].cpu())
        close(f"{name} choice values", full_c.gather(1, i.long().cpu()), rc.cpu(), rtol=1e-5, atol=1e-6)
    close(f"{name} weights", w, rw, rtol=1e-4, atol=1e-5)


def case_route(lib, g):
    l = torch.randn(300, 256, generator=g).to(DEV)
    b = (torch.rand(256, generator=g) * 0.1).to(DEV)
    l[1] = 0.25                                  # all tied: the bias alone chooses
    l[2, 5] = float("nan")                       # NaN: its group first, ranked first, weights NaN
    l[3] = NEG_INF                               # sigmoid 0 everywhere: bias chooses, weights 0 (zero sum)
    l[4, 32:64] = 9.0                            # one dominant group
    ds = dict(scoring="sigmoid", n_group=8, topk_group=4, renormalize=True, scale=2.5)
    check_route("route_deepseek_v3", lib, "route_deepseek_v3", l, b, 8, **ds)
    flip = b.clone()
    flip[7] = 5.0                                # a bias that flips a selection, never a weight
    check_route("route_deepseek_v3 (bias flips)", lib, "route_deepseek_v3", l, flip, 8, **ds)
    tie = torch.zeros(300, 256, device=DEV)      # every score equal: lowest groups, lowest indices
    check_route("route_deepseek_v3 (ties)", lib, "route_deepseek_v3", tie, torch.zeros(256, device=DEV), 8,
                exact=True, **ds)

    # A custom score region (DeepSeek-V4's sqrtsoftplus), inlined per lane: the same adversarial rows.
    v4 = dict(scoring="sqrtsoftplus", renormalize=True, scale=2.5)
    check_route("route_deepseek_v4", lib, "route_deepseek_v4", l, b, 8, **v4)
    check_route("route_deepseek_v4 (ties)", lib, "route_deepseek_v4", tie, torch.zeros(256, device=DEV), 8,
                exact=True, **v4)

    l = torch.randn(64, 384, generator=g).to(DEV).bfloat16()      # bf16 ties are common
    b = (torch.rand(384, generator=g) * 0.05).to(DEV)
    check_route("route_kimi_k2", lib, "route_kimi_k2", l, b, 8, scoring="sigmoid", renormalize=True, scale=2.827)

    l = torch.randn(40, 160, generator=g).to(DEV)
    l[0, 20:40] = 3.0                            # equal scores inside a group
    check_route("route_deepseek_v2", lib, "route_deepseek_v2", l, None, 6, n_group=8, topk_group=3,
                group_score="max", scale=16.0)

    l = torch.randn(77, 128, generator=g).to(DEV).half()
    l[0] = NEG_INF                               # softmax of a row of -inf: zeros, never NaN
    check_route("route_qwen3", lib, "route_qwen3", l, None, 8, renormalize=True)

    l = torch.randn(100, 20, generator=g).to(DEV)
    l[0, :17] = NEG_INF                          # k picks of which one is -inf
    l[1] = NEG_INF                               # all -inf: zeros
    check_route("route_gpt_oss", lib, "route_gpt_oss", l, None, 4, order="topk_then_score")
    l = torch.randn(50, 16, generator=g).to(DEV)
    check_route("route_llama4", lib, "route_llama4", l, None, 1, scoring="sigmoid", order="topk_then_score")
    l = torch.randn(9, 6, generator=g).to(DEV)
    l[0] = 1.0
    check_route("route_k_eq_e", lib, "route_k_eq_e", l, None, 6, exact=True, renormalize=True)

    # The shapes of route-map=lanes (a folder built with MOE_GPU_AOT_OPTIONS=route-map=lanes runs its kernel; the
    # default build the warp kernel): rows of ties, -inf, NaN, sorted rows (the best experts crowd one lane's list:
    # refills), and the same rows misaligned by one element (4-byte loads instead of 16-byte ones).
    def adversarial(x):
        x = adversarial_rows(x, g)
        x[6] = 0.0
        return x

    def misaligned(x):
        flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
        view = flat[1:].view(x.shape)
        view.copy_(x)
        return view

    shapes = [("route_shapes_288_k32", (300, 288), torch.float32, 32, False, dict(renormalize=True)),
              ("route_shapes_896_bf16", (300, 896), torch.bfloat16, 16, True,
               dict(scoring="sigmoid", renormalize=True, scale=2.5)),
              ("route_shapes_1024_g8", (200, 1024), torch.float32, 8, True,
               dict(scoring="sigmoid", n_group=8, topk_group=4, renormalize=True, scale=2.5)),
              ("route_shapes_256_g4_f16", (300, 256), torch.float16, 8, False,
               dict(n_group=4, topk_group=2, group_score="max", renormalize=True)),
              ("route_shapes_192_g6", (300, 192), torch.float32, 6, True,
               dict(scoring="sigmoid", n_group=6, topk_group=3, renormalize=True)),
              ("route_shapes_64_g16", (300, 64), torch.float32, 8, False,
               dict(n_group=16, topk_group=4, renormalize=True)),
              ("route_shapes_2100_g3", (150, 2100), torch.float32, 8, True,
               dict(scoring="sigmoid", n_group=3, topk_group=2, renormalize=True)),
              # 128 f32 logits and biases a lane: the lanes kernel's keys formed 64 slots at a time.
              ("route_shapes_4096_f32_bias", (70, 4096), torch.float32, 8, True,
               dict(scoring="sigmoid", n_group=64, topk_group=8, renormalize=True)),
              # The loop kernel (shapes the lanes' layout does not take): 5 groups of 819, 64 of 65 with 8 kept.
              ("route_shapes_4095_g5", (70, 4095), torch.float32, 8, True,
               dict(scoring="sigmoid", n_group=5, topk_group=2, renormalize=True, scale=2.5)),
              ("route_shapes_4160_g64_bf16", (70, 4160), torch.bfloat16, 8, True,
               dict(scoring="sigmoid", n_group=64, topk_group=8, renormalize=True))]
    for fn, shape, dtype, k, has_bias, attrs in shapes:
        x = adversarial(torch.randn(*shape, generator=g).to(DEV).to(dtype))
        bias = (torch.rand(shape[1], generator=g) * 0.1).to(DEV) if has_bias else None
        check_route(fn, lib, fn, x, bias, k, **attrs)
        check_route(f"{fn} (misaligned)", lib, fn, misaligned(x), bias, k, **attrs)

    case_route_replay(lib, g)

    w, i = lib.call("route_no_tokens", [torch.empty(0, 256, device=DEV), torch.zeros(256, device=DEV)],
                    [((0, 8), torch.float32), ((0, 8), torch.int32)])
    if w.numel() or i.numel():
        raise AssertionError("route_no_tokens: results are not empty")


def case_route_replay(lib, g):
    """Routing replay: the router's own choice given back gives its weights bit for bit (the H200 run of
    2026-11-26 found DeepSeek-V2's softmax router a bit off when another kernel replayed it); given indices (a
    repeated expert too) weigh as the reference; one outside [0, E) is reported and read as expert 0."""
    lib.cpu.moeSetErrorEcho(0)
    cases = [("route_deepseek_v3", (300, 256), True, torch.int64,
              dict(scoring="sigmoid", n_group=8, topk_group=4, renormalize=True, scale=2.5)),
             ("route_deepseek_v2", (40, 160), False, torch.int32,
              dict(n_group=8, topk_group=3, group_score="max", scale=16.0))]
    for fn, (T, E), has_bias, itype, attrs in cases:
        k = 8 if has_bias else 6
        l = torch.randn(T, E, generator=g).to(DEV)
        l[1] = 0.25                              # ties
        args = [l] + ([(torch.rand(E, generator=g) * 0.1).to(DEV)] if has_bias else [])
        outs = [((T, k), torch.float32), ((T, k), torch.int32)]
        w, i = lib.call(fn, args, outs)
        w2, i2 = lib.call(f"{fn}_replay", args + [i.to(itype)], outs)
        err = lib.take_error()
        if err:
            raise AssertionError(f"{fn}_replay: the call failed: {err}")
        same(f"{fn}_replay (own choice) indices", i2, i)
        if not torch.equal(w2.cpu().view(torch.int32), w.cpu().view(torch.int32)):
            raise AssertionError(f"{fn}_replay: the own choice's weights are not bit for bit "
                                 f"(max difference {(w2 - w).abs().max().item():.3g})")
        given = torch.randint(0, E, (T, k), generator=g, dtype=itype)
        given[0] = given[0, 0]                   # one expert k times
        w3, i3 = lib.call(f"{fn}_replay", args + [given.to(DEV)], outs)
        same(f"{fn}_replay (given) indices", i3, given)
        close(f"{fn}_replay (given) weights", w3, ref_route(l, None, k, **attrs, replay=given)[0], rtol=1e-4,
              atol=1e-5)
        bad = given.clone()
        bad[7, 2] = E
        w4, i4 = lib.call(f"{fn}_replay", args + [bad.to(DEV)], outs)
        err = lib.take_error()
        if not err or "moe.route: 'replay'" not in err or f"element {7 * k + 2} is {E}" not in err:
            raise AssertionError(f"{fn}_replay: expected an index error for element {7 * k + 2}, got {err!r}")
        if lib.results_after_error and i4.cpu()[7, 2] != 0:
            raise AssertionError(f"{fn}_replay: the out-of-range pick was not read as expert 0")


def check_plan(name, lib, fn, idx, E, B):
    N = idx.numel()
    P = N + E * (B - 1)
    shapes = [(E,), (E + 1,), (N,), (N,), (P,), (-(-P // B),), (1,)]
    got = lib.call(fn, [idx], [(s, torch.int32) for s in shapes])
    err = lib.take_error()
    if err:
        raise AssertionError(f"{name}: the call failed: {err}")
    want = ref_dispatch_plan(idx.cpu(), E, B)
    for label, a, r in zip(("counts", "offsets", "order", "inverse", "padded_order", "block_experts",
                            "num_padded"), got, want):
        same(f"{name} {label}", a, r)


def case_dispatch_plan(lib, g):
    idx = torch.randint(0, 256, (4096, 8), generator=g).int()
    idx[:300] = 7                                # one hot expert over several chunks: the stable order
    idx[300:310] = torch.arange(246, 254).int()
    check_plan("plan_deepseek", lib, "plan_deepseek", idx.to(DEV), 256, 64)
    check_plan("plan_deepseek (one token)", lib, "plan_deepseek", idx[:1].to(DEV), 256, 64)
    check_plan("plan_deepseek (no token)", lib, "plan_deepseek", idx[:0].to(DEV), 256, 64)
    # Route + plan as one chain: the route checked as case_route checks it, the plan against the plan of the
    # indices the route returned (a function of them: exact), at 3000 tokens (24 chunks), one and none.
    ds = dict(scoring="sigmoid", n_group=8, topk_group=4, renormalize=True, scale=2.5)
    bias = (torch.rand(256, generator=g) * 0.1).to(DEV)
    for T in (3000, 1, 0):
        logits = torch.randn(T, 256, generator=g).to(DEV)
        if T > 4:
            logits[1] = 0.25                     # ties: the bias alone chooses
            logits[3] = NEG_INF
        N, P = T * 8, T * 8 + 256 * 63
        shapes = [((T, 8), torch.float32), ((T, 8), torch.int32)] + [
            (s, torch.int32) for s in [(256,), (257,), (N,), (N,), (P,), (-(-P // 64),), (1,)]]
        got = lib.call("route_plan_deepseek", [logits, bias], shapes)
        err = lib.take_error()
        if err:
            raise AssertionError(f"route_plan_deepseek (T = {T}): the call failed: {err}")
        if T:
            route_matches(f"route_plan_deepseek (T = {T})", logits, bias, 8, got[0], got[1], **ds)
        want = ref_dispatch_plan(got[1].cpu(), 256, 64)
        for label, a, r in zip(("counts", "offsets", "order", "inverse", "padded_order", "block_experts",
                                "num_padded"), got[2:], want):
            same(f"route_plan_deepseek (T = {T}) {label}", a, r)
    small = torch.randint(0, 7, (333, 3), generator=g)                    # int64, E = 7, expert 6 unused
    small[small == 6] = 5
    check_plan("plan_small", lib, "plan_small", small.to(DEV), 7, 1)
    lib.cpu.moeSetErrorEcho(0)
    bad = small.clone()
    bad[10, 2] = 7
    got = lib.call("plan_small", [bad.to(DEV)], [((7,), torch.int32), ((8,), torch.int32), ((999,), torch.int32),
                                                 ((999,), torch.int32), ((999,), torch.int32),
                                                 ((999,), torch.int32), ((1,), torch.int32)])
    err = lib.take_error()
    if not err or "element 32 is 7" not in err:
        raise AssertionError(f"plan_small: expected an index error for element 32, got {err!r}")
    if lib.results_after_error:
        want = ref_dispatch_plan(bad, 7, 1)
        same("plan_small (bad element left out) order", got[2], want[2])
        same("plan_small (bad element left out) inverse", got[3], want[3])


def close_scaled(name, got, want, rtol=1e-4):
    """close() with the absolute tolerance scaled to the reference's largest finite magnitude: the gradients of the
    balance losses are O(1 / T), far below close()'s fixed atol."""
    finite = torch.nan_to_num(want.double().cpu(), nan=0.0, posinf=0.0, neginf=0.0).abs()
    scale = finite.max().item() if finite.numel() else 0.0
    close(name, got, want, rtol=rtol, atol=max(scale, 1e-30) * rtol)


def check_stats(name, lib, fn, logits, k, mask=None, exact_counts=False):
    T, E = logits.shape
    args = [logits] if mask is None else [logits, mask]
    c, p, w = lib.call(fn, args, [((E,), torch.float32), ((E,), torch.float32), ((), torch.float32)])
    rc, rp, rw = ref_router_stats(logits, k, mask)
    if exact_counts:                             # 0/1 weights: the counts are integers, exactly
        same(f"{name} counts", c, rc)
    else:
        close(f"{name} counts", c, rc)
    close(f"{name} weight_sum", w, rw)
    close(f"{name} mean_probs", p, rp, rtol=1e-4, atol=1e-6)
    return c, p, w


def check_stats_grad(name, lib, fn, logits, W, g, mask=None):
    args = [logits] + ([] if mask is None else [mask]) + [W, g]
    d, = lib.call(fn, args, [(tuple(logits.shape), torch.float32)])
    close_scaled(f"{name} dlogits", d, ref_router_stats_grad(logits, mask, W, g))


def check_z(name, lib, fn, logits):
    z, = lib.call(fn, [logits], [((), torch.float32)])
    close(f"{name} loss", z, ref_router_z_loss(logits), rtol=1e-5, atol=0)


def check_zgrad(name, lib, fn, logits, dloss):
    d, = lib.call(fn, [logits, dloss], [(tuple(logits.shape), torch.float32)])
    close_scaled(f"{name} dlogits", d, ref_router_z_loss_grad(logits, dloss))


def balance_logits(g, T, E, dtype=torch.float32):
    """Random logits with the adversarial rows: all tied (picks 0..k-1, p = 1/E), all -inf (p = 0, picks 0..k-1),
    a tie at the top (the lower index first), some -inf, one finite logit."""
    x = torch.randn(T, E, generator=g) * 2
    x[1] = 0.75
    x[2] = NEG_INF
    x[3, E // 2] = x[3, E - 1] = 9.0
    x[4, ::2] = NEG_INF
    x[5] = NEG_INF
    x[5, E - 1] = 1.0
    return x.to(dtype).to(DEV)


def case_balance(lib, g):
    f32, bf16 = torch.float32, torch.bfloat16
    mask300 = torch.rand(300, generator=g)
    mask300[10:20] = 0.0                         # fully masked rows
    mask300[7] = 1.0

    x = balance_logits(g, 300, 8)
    c8, p8, w8 = check_stats("bal_stats_e8", lib, "bal_stats_e8", x, 2, exact_counts=True)
    check_stats("bal_stats_e8 (one token)", lib, "bal_stats_e8", x[3:4], 2, exact_counts=True)
    nan = x.clone()
    nan[6, 5] = float("nan")                     # picked first; its row's probabilities (so every P_e) NaN
    check_stats("bal_stats_e8 (NaN)", lib, "bal_stats_e8", nan, 2, exact_counts=True)
    c, p, w = lib.call("bal_stats_e8", [x[:0]], [((8,), f32), ((8,), f32), ((), f32)])
    if c.abs().sum().item() != 0 or w.item() != 0 or not torch.isnan(p).all():
        raise AssertionError(f"bal_stats_e8 (no token): want counts 0, W 0, P NaN; got {c}, {w}, {p}")
    check_stats("bal_stats_e8_kE_mask", lib, "bal_stats_e8_kE_mask", x, 8, mask300.to(DEV))
    c0, p0, w0 = check_stats("bal_stats_e8_kE_mask (all masked)", lib, "bal_stats_e8_kE_mask", x, 8,
                             torch.zeros(300, device=DEV), exact_counts=True)
    if w0.item() != 0 or not torch.isnan(p0).all():
        raise AssertionError("bal_stats_e8_kE_mask (all masked): want W = 0 and P NaN")

    x64 = balance_logits(g, 300, 64, bf16)       # bf16: many more ties
    m01 = (torch.rand(300, generator=g) > 0.3).float()
    c64, p64, w64 = check_stats("bal_stats_e64_bf16_mask", lib, "bal_stats_e64_bf16_mask", x64, 2,
                                m01.to(DEV), exact_counts=True)
    check_stats("bal_stats_e64_kE", lib, "bal_stats_e64_kE", balance_logits(g, 130, 64), 64, exact_counts=True)
    x100 = balance_logits(g, 257, 100)
    check_stats("bal_stats_e100_k1", lib, "bal_stats_e100_k1", x100, 1, exact_counts=True)
    x256 = balance_logits(g, 300, 256)
    check_stats("bal_stats_e256_bf16mask", lib, "bal_stats_e256_bf16mask", x256, 8, mask300.to(DEV).bfloat16())
    x2048 = balance_logits(g, 70, 2048, bf16)
    check_stats("bal_stats_e2048_bf16", lib, "bal_stats_e2048_bf16", x2048, 4, exact_counts=True)
    check_stats("bal_stats_dyn", lib, "bal_stats_dyn", balance_logits(g, 65, 37), 3, mask300[:65].to(DEV))
    check_stats("bal_stats_dyn (E = 3, k = E)", lib, "bal_stats_dyn", balance_logits(g, 9, 3), 3,
                torch.ones(9, device=DEV))

    # The Switch loss on hand-made statistics, on the kernel's own (above), and end to end.
    loss, = lib.call("bal_loss_e8", [c8, p8, w8], [((), f32)])
    close("bal_loss_e8", loss, ref_load_balancing_loss(c8, p8, w8))
    loss, = lib.call("bal_loss_e8", [c0, p0, w0], [((), f32)])  # every token masked: NaN, as transformers
    if not torch.isnan(loss).item():
        raise AssertionError(f"bal_loss_e8 (W = 0): want NaN, got {loss.item()}")
    cd, pd = torch.rand(300, generator=g).to(DEV) * 5, torch.rand(300, generator=g).to(DEV)
    wd = torch.tensor(17.0, device=DEV)
    loss, = lib.call("bal_loss_dyn", [cd, pd, wd], [((), f32)])
    close("bal_loss_dyn", loss, ref_load_balancing_loss(cd, pd, wd))
    loss, = lib.call("bal_switch_e64_bf16_mask", [x64, m01.to(DEV)], [((), f32)])
    rc, rp, rw = ref_router_stats(x64, 2, m01.to(DEV))
    close("bal_switch_e64_bf16_mask", loss, ref_load_balancing_loss(rc, rp, rw), rtol=1e-5, atol=0)
    try:                                         # transformers' own function where it is installed
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    except Exception:  # noqa: BLE001
        load_balancing_loss_func = None
    if load_balancing_loss_func is not None:
        # Distinct logits (an arange shuffled per row, exact in bf16): no tie for torch.topk to break its own way.
        r = torch.stack([torch.randperm(64, generator=g) for _ in range(6 * 50)]).float() / 8
        am = (torch.rand(6, 50, generator=g) > 0.25).long()                    # [batch, sequence]
        loss, = lib.call("bal_switch_e64_bf16_mask", [r.bfloat16().to(DEV), am.reshape(-1).float().to(DEV)],
                         [((), f32)])
        close("bal_switch_e64_bf16_mask (transformers)", loss,
              load_balancing_loss_func((r.double(),), 64, 2, am), rtol=1e-5, atol=0)

    # The backward through the mean probabilities: Switch's g = E · counts / W, and a random one.
    check_stats_grad("bal_stats_grad_e8", lib, "bal_stats_grad_e8", x, w8, 8 * c8 / w8)
    check_stats_grad("bal_stats_grad_e8 (one token)", lib, "bal_stats_grad_e8", x[3:4], torch.tensor(1.0, device=DEV),
                     torch.randn(8, generator=g).to(DEV))
    d, = lib.call("bal_stats_grad_e8", [x[:0], w8, c8], [((0, 8), f32)])
    if d.numel():
        raise AssertionError("bal_stats_grad_e8 (no token): result is not empty")
    check_stats_grad("bal_stats_grad_e64_bf16_mask", lib, "bal_stats_grad_e64_bf16_mask", x64, w64,
                     torch.randn(64, generator=g).to(DEV), m01.to(DEV))
    m = mask300[:257].to(DEV)
    check_stats_grad("bal_stats_grad_e100_mask", lib, "bal_stats_grad_e100_mask", x100, m.sum(),
                     torch.randn(100, generator=g).to(DEV), m)
    check_stats_grad("bal_stats_grad_e256", lib, "bal_stats_grad_e256", x256, torch.tensor(300.0, device=DEV),
                     torch.randn(256, generator=g).to(DEV))
    check_stats_grad("bal_stats_grad_e2048_bf16", lib, "bal_stats_grad_e2048_bf16", x2048,
                     torch.tensor(70.0, device=DEV), torch.randn(2048, generator=g).to(DEV))

    # The z-loss: rows of -inf give +inf (loss) and NaN (gradient), so they get their own calls.
    def finite(t):
        return torch.where(torch.isinf(t), torch.zeros_like(t), t)
    check_z("bal_z_e8", lib, "bal_z_e8", finite(x))
    check_z("bal_z_e8 (one token)", lib, "bal_z_e8", x[3:4])
    check_z("bal_z_e8 (-inf row)", lib, "bal_z_e8", x)
    z, = lib.call("bal_z_e8", [x[:0]], [((), f32)])
    if not torch.isnan(z).item():
        raise AssertionError(f"bal_z_e8 (no token): want NaN, got {z.item()}")
    check_z("bal_z_e64_bf16", lib, "bal_z_e64_bf16", finite(x64))
    check_z("bal_z_e256", lib, "bal_z_e256", finite(x256) + 30.0)   # large logits: the shift by the row max
    check_z("bal_z_e2048_bf16", lib, "bal_z_e2048_bf16", finite(x2048))
    dl = torch.tensor(0.37, device=DEV)
    check_zgrad("bal_zgrad_e8", lib, "bal_zgrad_e8", x, dl)        # the -inf row: NaN, as autograd
    check_zgrad("bal_zgrad_e8 (one token)", lib, "bal_zgrad_e8", x[3:4], dl)
    d, = lib.call("bal_zgrad_e8", [x[:0], dl], [((0, 8), f32)])
    if d.numel():
        raise AssertionError("bal_zgrad_e8 (no token): result is not empty")
    check_zgrad("bal_zgrad_e64_bf16", lib, "bal_zgrad_e64_bf16", x64, dl)
    check_zgrad("bal_zgrad_e100", lib, "bal_zgrad_e100", x100, dl)
    check_zgrad("bal_zgrad_e256", lib, "bal_zgrad_e256", x256, dl)
    check_zgrad("bal_zgrad_e2048_bf16", lib, "bal_zgrad_e2048_bf16", x2048, dl)


CASES = {
    "topk_renorm": case_topk,
    "similarity_inform": case_similarity,
    "similarity_inform_topk_mma": case_similarity_topk_mma,
    "similarity_inform_grad": case_similarity_grad,
    "attention_posterior": case_attention,
    "attention_posterior_mma": case_attention_mma,
    "attention_posterior_grad": case_attention_grad,
    "mad_dispersion": case_mad,
    "adjacency_update": case_adjacency,
    "hyper_router": case_hyper,
    "hyper_router_grad": case_hyper_grad,
    "route": case_route,
    "dispatch_plan": case_dispatch_plan,
    "balance": case_balance,
}


def parse_only(values, known):
    """--only values (repeated and/or comma-separated) -> list of case names in
    CASES order; raises ValueError naming unknown ones. None: every case."""
    if values is None:
        return list(known)
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if not names:
        raise ValueError("--only needs at least one case name")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [n for n in known if n in names]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib")
    ap.add_argument("--runtime-dir")
    ap.add_argument("--manifest", help="the library's NAME.manifest.json (moe-aot.py): the pipeline options it was "
                    "built with (the kernel variants its cases run on), recorded in the results as aot_options")
    ap.add_argument("--only", action="append", metavar="CASE[,CASE...]",
                    help="run only these cases (repeatable, comma-separated)")
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--cpu-dry-run", metavar="CASES_MLIR",
                    help="no GPU: run the cases on the functions of CASES_MLIR compiled for the CPU by the "
                         "execution API (checks the cases and references themselves)")
    args = ap.parse_args(argv)
    try:
        args.cases = parse_only(args.only, list(CASES))
    except ValueError as exc:
        ap.error(str(exc))
    if not args.list and not args.cpu_dry_run and (not args.lib or not args.runtime_dir):
        ap.error("--lib and --runtime-dir are required")
    return args


def write_json(path, records, extra):
    if not path:
        return
    import json
    with open(path, "w") as f:
        json.dump(dict(extra, cases=records), f, indent=1)


def run_cases(lib, names):
    """Runs the named cases; returns [{name, status, message, seconds}]."""
    records = []
    for name in names:
        g = torch.Generator().manual_seed(1234)
        t0 = time.perf_counter()
        try:
            CASES[name](lib, g)
            status, message = "pass", ""
        except Exception as exc:  # noqa: BLE001
            status, message = "fail", f"{type(exc).__name__}: {exc}"
        finally:
            lib.cuda.synchronize()                   # nothing of one case runs into the next
        records.append({"name": name, "status": status, "message": message,
                        "seconds": round(time.perf_counter() - t0, 3)})
        print(f"PASS: {name}" if status == "pass" else f"FAIL: {name}: {message}", flush=True)
    return records


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    info = {"torch": torch.__version__, "cases_requested": args.cases}
    if args.cpu_dry_run:
        global DEV
        DEV = "cpu"
        records = run_cases(CpuLibrary(args.cpu_dry_run), args.cases)
        failed = sum(r["status"] != "pass" for r in records)
        write_json(args.json, records, dict(info, device="cpu (dry run)"))
        print(f"{len(records) - failed} passed, {failed} failed (CPU dry run)")
        return 1 if failed else 0

    def skipped(reason):
        write_json(args.json, [], dict(info, skipped=reason))
        skip(reason)

    if not torch.cuda.is_available():
        skipped("no CUDA device visible to PyTorch")
    for path in (args.lib, os.path.join(args.runtime_dir, "libmoe_cuda_runtime.so")):
        if not os.path.exists(path):
            skipped(f"{path} is missing")
    torch.cuda.init()
    info["aot_options"] = aot_options_of(args.manifest)
    lib = Library(args.lib, args.runtime_dir)
    if lib.rt.moeGpuDeviceCount() <= 0:
        skipped("the CUDA driver reports no device")
    info["device"] = torch.cuda.get_device_name()
    print(f"device: {info['device']} (torch {torch.__version__})")
    records = run_cases(lib, args.cases)
    failed = sum(r["status"] != "pass" for r in records)
    write_json(args.json, records, info)
    print(f"{len(records) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
