"""The benchmark cases: for each op, sizes, inputs, our MLIR function, the eager baseline and the output check.

Regimes: ``decode`` (T <= 64 tokens), ``prefill`` (T >= 16384 tokens; for the token-independent hyper_router:
the large generated routers), ``mid`` (the quick smoke-test sizes). The 2x target is judged on ``prefill``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from . import baselines as bl
from . import mlir as M


@dataclass
class Case:
    name: str                     # unique, also the MLIR function name
    op: str
    regime: str                   # decode | mid | prefill
    params: dict
    mlir: str
    make_inputs: Callable[[torch.Generator], list]
    out_specs: list               # [(shape, dtype)] of our results
    eager: Callable[..., Any]     # eager(*inputs) -> outputs (the timed baseline)
    check: Callable[[list, list, Any], float]   # check(inputs, ours, eager_out) -> max abs error; raises AssertionError
    note: str = ""
    extra: dict = field(default_factory=dict)


def record_check(rec: dict, case: Case, inputs: list, outs: Optional[list], ref: Any) -> None:
    """rec["check"]: "ok" (with rec["max_abs_err"]) when our outputs match the eager ones, "FAIL: ..." when they do
    not, "not run" when ours produced none."""
    if outs is None:
        rec["check"] = "not run"
        return
    try:
        rec["max_abs_err"] = case.check(inputs, outs, ref)
        rec["check"] = "ok"
    except AssertionError as exc:
        rec["check"] = f"FAIL: {exc}"


def record_torch_compile(rec: dict, case: Case, inputs: list, time_it: Callable[[Callable[[], Any]], None],
                         sync: Callable[[], None] = lambda: None, ndigits: int = 3) -> None:
    """The torch.compile (inductor, static shapes) baseline of ``case.eager``: the first call's seconds in
    rec["torch_compile_compile_s"] (``sync`` waits for the device), then ``time_it(call)`` records the timings;
    rec["torch_compile_error"] (and no time) when inductor fails, or where the case says extra["compile"] = False."""
    if case.extra.get("compile") is False:
        rec["torch_compile_ms"] = None
        rec["torch_compile_error"] = "not run (the case's baseline is autograd: dynamo breaks its graph at the grad)"
        return
    try:
        torch._dynamo.reset()
        fn = torch.compile(case.eager, dynamic=False)
        with torch.inference_mode():
            t0 = time.perf_counter()
            fn(*inputs)
            sync()
            rec["torch_compile_compile_s"] = round(time.perf_counter() - t0, ndigits)
            time_it(lambda: fn(*inputs))
    except Exception as exc:  # noqa: BLE001
        rec["torch_compile_ms"] = None
        rec["torch_compile_error"] = " | ".join(f"{type(exc).__name__}: {exc}".strip().splitlines()[:3])[:600]


def _close(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> float:
    got, want = got.detach().float(), want.detach().float()
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    if not torch.isfinite(got).all():
        raise AssertionError(f"{name}: non-finite values in our output")
    err = (got - want).abs()
    bad = err > atol + rtol * want.abs()
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(f"{name}: {int(bad.sum())} elements differ (max abs err {err.max().item():.3g}; "
                             f"first at flat {i}: ours {got.flatten()[i].item():.6g} vs torch "
                             f"{want.flatten()[i].item():.6g})")
    return float(err.max()) if err.numel() else 0.0


def _check_topk(scores: torch.Tensor, w, i, rw, ri, rtol=1e-4, atol=1e-6, rounded=False) -> float:
    """Indices may differ on (near-)ties: compare the scores at our indices with the scores at torch's, then the
    weights; at most 0.1% of the rows may order near-equal experts differently. ``rounded``: the kernel mixed
    f16/bf16-rounded probabilities, so near-equal experts may swap in many rows: the selected scores (within
    rtol/atol) are the check, the weights at rtol too."""
    sel = scores.float().gather(-1, i.long())
    ref = scores.float().gather(-1, ri.long())
    e1 = _close("selected scores", sel, ref, rtol, atol)
    if rounded:
        return e1
    e2 = _close("weights", w, rw, 1e-4, 1e-6)
    same = (i.long() == ri.long()).all(-1).float().mean().item()
    if same < 0.999:
        raise AssertionError(f"indices: only {same:.4%} of the rows pick torch's experts in torch's order")
    return max(e1, e2)


# ------------------------------------------------------------------------------------------------------------------
# Per-op case builders
# ------------------------------------------------------------------------------------------------------------------


def topk_case(regime: str, T: int, K: int, k: int, mode: str = "logits") -> Case:
    name = f"topk_{mode}_T{T}_K{K}_k{k}"

    def make(g):
        s = torch.randn(T, K, generator=g)
        return [torch.softmax(s, -1) if mode == "probs" else s]

    eager = (lambda s: bl.topk_renorm_logits(s, k)) if mode == "logits" else (lambda s: bl.topk_renorm_probs(s, k))

    def check(inp, ours, ref):
        return _check_topk(inp[0], ours[0], ours[1], ref[0], ref[1])

    c = Case(name, "topk_renorm", regime, dict(T=T, K=K, k=k, mode=mode, renormalize=True),
             M.topk_renorm(name, T, K, k, mode), make, [((T, k), torch.float32), ((T, k), torch.int32)],
             eager, check)
    return c


#: Operand element types of the similarity cases (bench/mlir.py element names).
_SIM_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def sdpa_mix(u, e, tau=1.0, causal=False):
    """Similarity mixing as torch's fused attention (``F.scaled_dot_product_attention`` with q = k = u, v = e, scale
    1/tau): the strongest PyTorch baseline of the mixing ops on a GPU (flash / memory-efficient / cuDNN kernels, in
    the operands' own type: tensor cores for f16/bf16)."""
    p = torch.nn.functional.scaled_dot_product_attention(u[:, None], u[:, None], e[:, None], scale=1.0 / tau,
                                                         is_causal=causal)
    return p[:, 0]


def similarity_case(regime: str, B: int, N: int, D: int, K: int, tau: float = 1.0, causal: bool = False,
                    k: Optional[int] = None, peaky: bool = False, dtype: str = "f32") -> Case:
    """``peaky``: unnormalised u (u_i.u_j ~ N(0, D), the diagonal ~D), so that most softmax weights of a row are far
    below the smallest normal f32 (the subnormal-operand cost of x86 FMAs, CK::softmaxWeight); else
    u_i.u_j ~ N(0, 1). ``dtype``: u and e in f32, f16 or bf16 (p is f32; the eager baseline computes in f32 from
    the rounded operands, extra["sdpa"] in the operands' type)."""
    fused = k is not None
    name = (f"sim{'_topk' if fused else ''}_B{B}_N{N}_D{D}_K{K}{f'_k{k}' if fused else ''}{'_causal' if causal else ''}"
            f"{'_peaky' if peaky else ''}{'' if dtype == 'f32' else '_' + dtype}")
    tdt = _SIM_DTYPES[dtype]

    def make(g):
        u = torch.randn(B, N, D, generator=g) / (1.0 if peaky else D ** 0.25)
        e = torch.softmax(torch.randn(B, N, K, generator=g), -1)
        return [u.to(tdt), e.to(tdt)]

    params = dict(B=B, N=N, D=D, K=K, tau=tau, causal=causal, T=B * N)
    if peaky:
        params["peaky"] = True
    if dtype != "f32":
        params["dtype"] = dtype
    extra = {"sdpa": lambda u, e: sdpa_mix(u, e, tau, causal)}
    if fused:
        params["k"] = k
        eager = lambda u, e: bl.similarity_mix_topk(u.float(), e.float(), k, tau, causal)
        mlir = M.similarity_inform_topk(name, B, N, D, K, k, tau, causal, elem=dtype)
        outs = [((B, N, k), torch.float32), ((B, N, k), torch.int32)]

        def check(inp, ours, ref):
            # the reference p (recomputed once, outside the timed region) ranks the experts
            u, e = inp
            p = bl.similarity_mix(u.float(), e.float(), tau, causal=causal)
            # f16/bf16: the tensor-core kernel's rounded probabilities (MMA_TOL, as below)
            return _check_topk(p, ours[0], ours[1], ref[0], ref[1], rtol=1e-3 if dtype == "f32" else 1e-2,
                               atol=1e-6 if dtype == "f32" else 2e-3, rounded=dtype != "f32")

        return Case(name, "similarity_inform_topk", regime, params, mlir, make, outs, eager, check, extra=extra)

    eager = lambda u, e: bl.similarity_mix(u, e, tau, causal=causal)
    # f16/bf16 operands: the tensor-core kernel rounds the probabilities to the operands' type before S.e (as
    # flash attention does), so it is held to the harness's MMA_TOL (test/GPU/run_gpu_tests.py)
    rtol, atol = (1e-3, 1e-5) if dtype == "f32" else (1e-2, 2e-3)

    def check(inp, ours, ref):
        return _close("p", ours[0], ref, rtol, atol)

    return Case(name, "similarity_inform", regime, params,
                M.similarity_inform(name, B, N, D, K, tau, causal, elem=dtype),
                make, [((B, N, K), torch.float32)], eager, check,
                note="eager materializes S [B,N,N] in f32: %.0f MiB" % (B * N * N * 4 / 2 ** 20), extra=extra)


def similarity_grad_case(regime: str, B: int, N: int, D: int, K: int, tau: float = 1.0, causal: bool = False,
                         dtype: str = "bf16") -> Case:
    """Forward + backward of the mixing: ours is similarity_inform_grad (the forward recomputed with its lse, then
    the two flash passes), eager autograd of the f32 mixing from the rounded operands, extra["sdpa"] torch's fused
    attention forward and backward in the operands' type (issue #47 item 5: at least 1.2x SDPA's)."""
    name = f"simgrad_B{B}_N{N}_D{D}_K{K}{'_causal' if causal else ''}{'' if dtype == 'f32' else '_' + dtype}"
    tdt = _SIM_DTYPES[dtype]

    def make(g):
        u = torch.randn(B, N, D, generator=g) / D ** 0.25
        e = torch.softmax(torch.randn(B, N, K, generator=g), -1)
        return [u.to(tdt), e.to(tdt), torch.randn(B, N, K, generator=g)]

    def grads(mix, u, e, dp):
        # The benches time baselines under torch.inference_mode: autograd back on for this one.
        with torch.inference_mode(False), torch.enable_grad():
            u, e = u.detach().requires_grad_(), e.detach().requires_grad_()
            return list(torch.autograd.grad(mix(u, e), [u, e], dp))

    eager = lambda u, e, dp: grads(lambda a, b: bl.similarity_mix(a.float(), b.float(), tau, causal=causal),  # noqa: E731
                                   u, e, dp)
    sdpa = lambda u, e, dp: grads(lambda a, b: sdpa_mix(a, b, tau, causal), u, e, dp.to(u.dtype))  # noqa: E731

    def check(inp, ours, ref):
        # f16/bf16: P, dX and dp rounded to the operand type (the tensor-core passes): within 3% of each
        # gradient's largest magnitude
        err = 0.0
        for label, got, want in zip(("du", "de"), ours, ref):
            scale = want.detach().float().abs().max().item()
            rtol = 1e-3 if dtype == "f32" else 3e-2
            err = max(err, _close(label, got, want, rtol, rtol * scale + 1e-6))
        return err

    params = dict(B=B, N=N, D=D, K=K, tau=tau, causal=causal, T=B * N, dtype=dtype)
    return Case(name, "similarity_inform_grad", regime, params,
                M.similarity_inform_grad(name, B, N, D, K, tau, causal, elem=dtype), make,
                [((B, N, D), torch.float32), ((B, N, K), torch.float32)], eager, check,
                extra={"sdpa": sdpa, "compile": False})


def attention_case(regime: str, B: int, H: int, N: int, Nk: int, D: int, Dh: int, K: int,
                   sigma: float = 2.0, dtype: str = "f32") -> Case:
    """``dtype``: u and e in f32, f16 or bf16 (the others f32; the eager baseline computes in f32 from the rounded
    operands); f16/bf16 run the mixing on tensor cores."""
    name = f"attn_B{B}_H{H}_N{N}_Nk{Nk}_D{D}_Dh{Dh}_K{K}" + ("" if dtype == "f32" else "_" + dtype)
    tdt = _SIM_DTYPES[dtype]

    def make(g):
        # heads of clearly different sharpness, so that the min-entropy head is not a near tie
        scale = torch.linspace(0.5, 3.0, H)[None, :, None, None]
        s = torch.randn(B, H, N, Nk, generator=g) * scale
        u = torch.randn(B, N, D, generator=g) * 0.5
        v = torch.randn(B, H, Nk, Dh, generator=g) * 0.1
        wo = torch.randn(D, H * Dh, generator=g) / math.sqrt(H * Dh)
        e = torch.softmax(torch.randn(B, Nk, K, generator=g), -1)
        return [s, u.to(tdt), v, wo, e.to(tdt)]

    eager = lambda s, u, v, wo, e: bl.attention_posterior(s, u.float(), v, wo, e.float(), sigma)
    # the tensor-core kernel's probabilities and head means enter the products rounded to the operand type
    tol = 1e-3 if dtype == "f32" else 2e-2

    def check(inp, ours, ref):
        if not torch.equal(ours[1].long(), ref[1].long()):
            raise AssertionError(f"head: ours {ours[1].tolist()} vs torch {ref[1].tolist()}")
        return _close("p", ours[0], ref[0], tol, 1e-5)

    params = dict(B=B, H=H, N=N, Nk=Nk, D=D, Dh=Dh, K=K, sigma=sigma, head_select="min_entropy", T=B * N)
    if dtype != "f32":
        params["dtype"] = dtype
    return Case(name, "attention_posterior", regime, params,
                M.attention_posterior(name, B, H, N, Nk, D, Dh, K, sigma, elem=dtype), make,
                [((B, N, K), torch.float32), ((B,), torch.int32)], eager, check,
                note="scores input is [B,H,N,Nk] f32: %.0f MiB" % (B * H * N * Nk * 4 / 2 ** 20))


def mad_case(regime: str, T: int, D: int, E: int) -> Case:
    name = f"mad_T{T}_D{D}_E{E}"

    def make(g):
        x = torch.randn(T, D, generator=g) * (1 + torch.rand(D, generator=g))
        a = torch.randint(0, E, (T,), generator=g, dtype=torch.int32)
        return [x, a]

    eager = lambda x, a: bl.mad_dispersion(x, a, E)

    def check(inp, ours, ref):
        if not torch.equal(ours[1].long(), ref[1].long()):
            raise AssertionError("counts differ")
        return _close("w", ours[0], ref[0], 1e-3, 1e-5)

    return Case(name, "mad_dispersion", regime, dict(T=T, D=D, E=E, measure="mad", normalize="feature",
                                                     empty="identity", clip=10.0, eps=1e-4),
                M.mad_dispersion(name, T, D, E), make, [((E, D), torch.float32), ((E,), torch.int32)], eager, check)


def adjacency_case(regime: str, T: int, E: int, k: int) -> Case:
    name = f"adj_T{T}_E{E}_k{k}"

    def make(g):
        a = torch.rand(E, E, generator=g)
        a = a / a.sum(1, keepdim=True)
        idx = torch.rand(T, E, generator=g).topk(k, -1).indices.to(torch.int32)   # k distinct experts per token
        return [a, idx]

    eager = lambda a, idx: bl.adjacency_update(a, idx, 0.9)

    def check(inp, ours, ref):
        return _close("a_next", ours[0], ref, 1e-4, 1e-6)

    return Case(name, "adjacency_update", regime, dict(T=T, E=E, k=k, beta=0.9, norm="row", include_self=True),
                M.adjacency_update(name, T, E, k, 0.9), make, [((E, E), torch.float32)], eager, check)


def hyper_case(regime: str, De: int, Dh: int, D: int, E: int) -> Case:
    name = f"hyper_De{De}_Dh{Dh}_D{D}_E{E}"

    def make(g):
        emb = torch.randn(De, generator=g)
        w1 = torch.randn(Dh, De, generator=g) * 0.02 * 8
        b1 = torch.randn(Dh, generator=g) * 0.1
        w2 = torch.randn(E * (D + 1), Dh, generator=g) * 0.02
        b2 = torch.randn(E * (D + 1), generator=g) * 0.01
        return [emb, w1, b1, w2, b2]

    eager = lambda emb, w1, b1, w2, b2: bl.hyper_router(emb, w1, b1, w2, b2, E)

    def check(inp, ours, ref):
        return max(_close("w", ours[0], ref[0], 1e-3, 1e-5), _close("b", ours[1], ref[1], 1e-3, 1e-5))

    return Case(name, "hyper_router", regime, dict(De=De, Dh=Dh, D=D, E=E, w2_MiB=E * (D + 1) * Dh * 4 / 2 ** 20),
                M.hyper_router(name, De, Dh, D, E), make, [((E, D), torch.float32), ((E,), torch.float32)],
                eager, check, note="token-independent (the router is generated once per step); memory-bound GEMVs",
                extra={"bytes": 4 * (E * (D + 1) * (Dh + 2) + Dh * (De + 2) + De)})


def route_case(regime: str, T: int) -> Case:
    """DeepSeek-V3's router from its logits on (E = 256, 8 groups, top-4 groups, k = 8), against HF's
    DeepseekV3TopkRouter maths; issue 13's GPU target: T = 8192 in <= 14 us on an H100/H200."""
    name = f"route_deepseek_v3_T{T}"

    def make(g):
        return [torch.randn(T, 256, generator=g), 0.1 * torch.randn(256, generator=g)]

    eager = lambda x, b: bl.hf_grouped_router(x, b, 8, 8, 4, 2.5)

    def check(inp, ours, ref):
        # HF's top-k is unsorted: compare the chosen sets (sorted by index) and their weights.
        (w, i), (rw, ri) = ours, ref
        o, ro = i.long().argsort(-1), ri.long().argsort(-1)
        if not torch.equal(i.long().gather(-1, o), ri.long().gather(-1, ro)):
            raise AssertionError("different experts chosen")
        return _close("weights", w.gather(-1, o), rw.gather(-1, ro), 1e-5, 1e-6)

    return Case(name, "route", regime, dict(T=T, E=256, k=8, n_group=8, topk_group=4), M.route_deepseek_v3(name, T),
                make, [((T, 8), torch.float32), ((T, 8), torch.int32)], eager, check)


def route_plan_case(regime: str, T: int) -> Case:
    """DeepSeek-V3's router and the dispatch plan of its picks as one chain (issue 46's GPU target: T = 8192 in
    <= 10 us), against HF's router maths followed by the reference plan. The plan is checked exactly against the
    reference plan of our own indices (HF's top-k is unsorted, so its plan orders a token's slots differently)."""
    name = f"route_plan_deepseek_v3_T{T}"
    N, P = T * 8, T * 8 + 256 * 63

    def make(g):
        return [torch.randn(T, 256, generator=g), 0.1 * torch.randn(256, generator=g)]

    def eager(x, b):
        from moe_mlir.reference.routing import dispatch_plan
        w, i = bl.hf_grouped_router(x, b, 8, 8, 4, 2.5)
        return (w, i) + tuple(dispatch_plan(i, 256, 64))

    route = route_case(regime, T)

    def check(inp, ours, ref):
        from moe_mlir.reference.routing import dispatch_plan
        err = route.check(inp, ours[:2], ref[:2])
        for label, a, r in zip(("counts", "offsets", "order", "inverse", "padded_order", "block_experts",
                                "num_padded"), ours[2:], dispatch_plan(ours[1].cpu(), 256, 64)):
            if not torch.equal(a.cpu().long(), r.long()):
                raise AssertionError(f"plan {label} differs from the reference plan of our indices")
        return err

    i32 = torch.int32
    outs = [((T, 8), torch.float32), ((T, 8), i32), ((256,), i32), ((257,), i32), ((N,), i32), ((N,), i32),
            ((P,), i32), ((-(-P // 64),), i32), ((1,), i32)]
    return Case(name, "route", regime, dict(T=T, E=256, k=8, n_group=8, topk_group=4, block=64),
                M.route_plan_deepseek_v3(name, T), make, outs, eager, check)


def full_cases() -> list[Case]:
    cs = [
        # topk_renorm: decode and prefill, K from 8 to 256
        topk_case("decode", 64, 8, 2), topk_case("decode", 64, 64, 8), topk_case("decode", 64, 256, 8),
        topk_case("prefill", 16384, 8, 2), topk_case("prefill", 16384, 64, 8), topk_case("prefill", 16384, 256, 8),
        topk_case("prefill", 16384, 64, 8, "probs"),
        # similarity_inform (N up to 16384; D from 64 to 1024)
        similarity_case("decode", 1, 64, 64, 16), similarity_case("decode", 1, 64, 1024, 64),
        similarity_case("prefill", 1, 16384, 64, 16),
        similarity_case("prefill", 4, 4096, 256, 64, causal=True),
        similarity_case("prefill", 4, 4096, 256, 64, causal=True, peaky=True),
        # the fused similarity_inform_topk
        similarity_case("decode", 1, 64, 64, 16, k=2),
        similarity_case("prefill", 1, 16384, 64, 16, k=2),
        # attention_posterior
        attention_case("decode", 1, 8, 64, 64, 512, 64, 16),
        similarity_case("prefill", 1, 16384, 64, 16, k=2, dtype="bf16"),
        # forward + backward (the tensor-core passes with flash-mma-grad, the scalar ones by default)
        similarity_grad_case("prefill", 1, 16384, 64, 16), similarity_grad_case("prefill", 4, 4096, 64, 16, causal=True),
        attention_case("prefill", 16, 4, 1024, 1024, 256, 64, 16),
        attention_case("prefill", 16, 4, 1024, 1024, 256, 64, 16, dtype="bf16"),
        # mad_dispersion (E experts from 8 to 256, D from 64 to 1024)
        mad_case("decode", 64, 256, 8),
        mad_case("prefill", 16384, 64, 8), mad_case("prefill", 16384, 1024, 64), mad_case("prefill", 16384, 256, 256),
        # adjacency_update: one case per kernel strategy (AdjacencyUpdate.cpp): histogram (E=8), mask rows (E=16 k=2:
        # one vector per row on AVX-512, two on AVX2; E=64 k=8), counting (E=256)
        adjacency_case("decode", 64, 64, 8),
        adjacency_case("prefill", 16384, 8, 2), adjacency_case("prefill", 16384, 16, 2),
        adjacency_case("prefill", 16384, 64, 8), adjacency_case("prefill", 16384, 256, 8),
        # hyper_router: token-independent; "prefill" = the large generated routers
        hyper_case("decode", 256, 256, 64, 8),
        hyper_case("prefill", 256, 256, 1024, 64), hyper_case("prefill", 256, 256, 1024, 256),
    ]
    return cs


def quick_cases() -> list[Case]:
    return [
        topk_case("decode", 64, 64, 8), topk_case("mid", 4096, 64, 8),
        similarity_case("decode", 1, 64, 64, 16), similarity_case("mid", 1, 512, 64, 16),
        similarity_case("mid", 1, 512, 64, 16, k=2),
        attention_case("decode", 1, 4, 64, 64, 128, 32, 16),
        mad_case("mid", 4096, 64, 8),
        adjacency_case("mid", 4096, 64, 8),
        hyper_case("decode", 256, 256, 64, 8),
    ]


def gpu_cases() -> list[Case]:
    """The GPU benchmark (bench/gpu): compiled ahead of time for sm_90 by bench/gpu/build_artifacts.sh.
    The three topk_renorm cases at 65536 tokens are the HBM-roofline cases."""
    return [
        topk_case("decode", 64, 256, 8),
        # where list's lanes start to beat redux's warp a token (H200, 2026-11-26: redux at 64 tokens, list at 65536)
        topk_case("prefill", 1024, 256, 8), topk_case("prefill", 4096, 256, 8),
        topk_case("prefill", 65536, 64, 8), topk_case("prefill", 65536, 128, 8), topk_case("prefill", 65536, 256, 8),
        topk_case("prefill", 65536, 128, 8, "probs"),
        similarity_case("decode", 1, 64, 64, 16),
        similarity_case("prefill", 1, 16384, 64, 16),
        similarity_case("prefill", 4, 4096, 256, 64, causal=True),
        similarity_case("prefill", 1, 16384, 64, 16, k=2),
        # f16/bf16 operands: the tensor-core kernel
        similarity_case("decode", 1, 64, 64, 16, dtype="bf16"),
        similarity_case("prefill", 1, 16384, 64, 16, dtype="bf16"),
        similarity_case("prefill", 4, 4096, 256, 64, causal=True, dtype="bf16"),
        similarity_case("prefill", 1, 16384, 64, 16, dtype="f16"),
        similarity_case("prefill", 1, 16384, 64, 16, k=2, dtype="bf16"),
        # forward + backward against SDPA's (issue #47 item 5's 1.2x; the tensor-core passes in a folder built with
        # flash-mma-grad, the scalar ones by default), and at the causal D = 256 shape (the passes' feature split)
        similarity_grad_case("prefill", 1, 16384, 64, 16), similarity_grad_case("prefill", 4, 4096, 64, 16, causal=True),
        similarity_grad_case("prefill", 4, 4096, 256, 64, causal=True),
        attention_case("prefill", 16, 4, 1024, 1024, 256, 64, 16),
        attention_case("prefill", 16, 4, 1024, 1024, 256, 64, 16, dtype="bf16"),
        mad_case("prefill", 65536, 1024, 64), mad_case("prefill", 16384, 256, 256),
        adjacency_case("prefill", 65536, 256, 8),
        hyper_case("prefill", 256, 256, 1024, 256),
        route_case("decode", 64), route_case("prefill", 8192),
        route_plan_case("decode", 64), route_plan_case("prefill", 8192),
    ]


def find_case(name: str, pools=(full_cases, quick_cases, gpu_cases)) -> Case:
    for pool in pools:
        for c in pool():
            if c.name == name:
                return c
    raise KeyError(name)
