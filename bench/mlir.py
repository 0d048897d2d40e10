"""MLIR text of the benchmark kernels: one public function per case, static shapes.

Torch-free on purpose: the peak-memory worker (bench/memory.py) builds the module without importing torch, and the
GPU artifact builder (bench/gpu/gen_cases.py) reuses the same generators.

The ops use the pretty form of docs/MoEOps.md (the same spelling as test/GPU/Inputs/gpu-cases.mlir).
"""

from __future__ import annotations

from typing import Sequence


def _t(shape: Sequence[int], elem: str = "f32") -> str:
    return "tensor<" + "x".join(str(int(s)) for s in shape) + ("x" if len(shape) else "") + elem + ">"


def _f(x: float) -> str:
    return f"{float(x):.6e}"


def _func(name: str, args: Sequence[tuple[str, str]], results: Sequence[str], body: str, rets: Sequence[str]) -> str:
    sig = ", ".join(f"%{a}: {t}" for a, t in args)
    res = ", ".join(results)
    res = f"({res})" if len(results) > 1 else res
    ret = f"return {', '.join(rets)} : {', '.join(results)}"
    return f"func.func @{name}({sig}) -> {res} {{\n  {body}\n  {ret}\n}}\n"


def topk_renorm(name: str, T: int, K: int, k: int, mode: str = "logits", renormalize: bool = True,
                lead: Sequence[int] = ()) -> str:
    shape = (*lead, T) if lead else (T,)
    s, o = _t((*shape, K)), _t((*shape, k))
    oi = _t((*shape, k), "i32")
    attrs = f"k({k})"
    if mode != "logits":
        attrs += f" mode({mode})"
    if not renormalize:
        attrs += " renormalize(false)"
    body = f"%w, %i = moe.topk_renorm %s {attrs} : {s} -> {o}, {oi}"
    return _func(name, [("s", s)], [o, oi], body, ["%w", "%i"])


def _sim_attrs(tau: float, causal: bool) -> str:
    return f"tau({_f(tau)})" + (" causal(true)" if causal else "")


def similarity_inform(name: str, B: int, N: int, D: int, K: int, tau: float = 1.0, causal: bool = False,
                      elem: str = "f32") -> str:
    """``elem``: the element type of u and e (f32, f16, bf16); p is f32 (f16/bf16 operands of one type run on
    tensor cores)."""
    u, e, p = _t((B, N, D), elem), _t((B, N, K), elem), _t((B, N, K))
    body = f"%p = moe.similarity_inform %u, %e {_sim_attrs(tau, causal)} : {u}, {e} -> {p}"
    return _func(name, [("u", u), ("e", e)], [p], body, ["%p"])


def similarity_inform_topk(name: str, B: int, N: int, D: int, K: int, k: int, tau: float = 1.0,
                           causal: bool = False, elem: str = "f32") -> str:
    u, e = _t((B, N, D), elem), _t((B, N, K), elem)
    w, i = _t((B, N, k)), _t((B, N, k), "i32")
    body = (f"%w, %i = moe.similarity_inform_topk %u, %e k({k}) {_sim_attrs(tau, causal)} : {u}, {e} -> {w}, {i}")
    return _func(name, [("u", u), ("e", e)], [w, i], body, ["%w", "%i"])


def similarity_inform_grad(name: str, B: int, N: int, D: int, K: int, tau: float = 1.0, causal: bool = False,
                           elem: str = "f32") -> str:
    """The backward of similarity_inform from its inputs and the cotangent dp (f32): the forward recomputed, then
    the flash passes (f16/bf16 u and e run both on tensor cores with moe-lower-to-nvvm's flash-mma-grad)."""
    u, e, dp = _t((B, N, D), elem), _t((B, N, K), elem), _t((B, N, K))
    du, de = _t((B, N, D)), _t((B, N, K))
    body = (f"%du, %de = moe.similarity_inform_grad %u, %e dp(%dp : {dp}) {_sim_attrs(tau, causal)} : {u}, {e} "
            f"-> {du}, {de}")
    return _func(name, [("u", u), ("e", e), ("dp", dp)], [du, de], body, ["%du", "%de"])


def attention_posterior(name: str, B: int, H: int, N: int, Nk: int, D: int, Dh: int, K: int,
                        sigma: float = 1.0, elem: str = "f32") -> str:
    """``elem``: the element type of u and e (f16/bf16 of one type run the mixing on tensor cores)."""
    s, u, v = _t((B, H, N, Nk)), _t((B, N, D), elem), _t((B, H, Nk, Dh))
    wo, e = _t((D, H * Dh)), _t((B, Nk, K), elem)
    p, h = _t((B, N, K)), _t((B,), "i32")
    body = (f"%p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma({_f(sigma)}) : "
            f"{s}, {u}, {v}, {wo}, {e} -> {p}, {h}")
    return _func(name, [("s", s), ("u", u), ("v", v), ("wo", wo), ("e", e)], [p, h], body, ["%p", "%h"])


def mad_dispersion(name: str, T: int, D: int, E: int) -> str:
    x, a = _t((T, D)), _t((T,), "i32")
    w, c = _t((E, D)), _t((E,), "i32")
    body = f"%w, %c = moe.mad_dispersion %x, %a num_experts({E}) : {x}, {a} -> {w}, {c}"
    return _func(name, [("x", x), ("a", a)], [w, c], body, ["%w", "%c"])


def adjacency_update(name: str, T: int, E: int, k: int, beta: float = 0.9) -> str:
    a, idx = _t((E, E)), _t((T, k), "i32")
    body = f"%n = moe.adjacency_update %a, %idx beta({_f(beta)}) : {a}, {idx} -> {a}"
    return _func(name, [("a", a), ("idx", idx)], [a], body, ["%n"])


def hyper_router(name: str, De: int, Dh: int, D: int, E: int) -> str:
    emb, w1, b1 = _t((De,)), _t((Dh, De)), _t((Dh,))
    w2, b2 = _t((E * (D + 1), Dh)), _t((E * (D + 1),))
    w, b = _t((E, D)), _t((E,))
    body = (f"%w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts({E}) : "
            f"{emb}, {w1}, {b1}, {w2}, {b2} -> {w}, {b}")
    return _func(name, [("emb", emb), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)], [w, b], body,
                 ["%w", "%b"])


GENERATORS = {
    "topk_renorm": topk_renorm,
    "similarity_inform": similarity_inform,
    "similarity_inform_topk": similarity_inform_topk,
    "attention_posterior": attention_posterior,
    "mad_dispersion": mad_dispersion,
    "adjacency_update": adjacency_update,
    "hyper_router": hyper_router,
}


def route_deepseek_v3(name: str, T: int, E: int = 256, k: int = 8, n_group: int = 8, topk_group: int = 4,
                      scale: float = 2.5) -> str:
    """moe.route with DeepSeek-V3's attributes (sigmoid, correction bias, grouped top-k, renormalize, scaling)."""
    x, b, o, oi = _t((T, E)), _t((E,)), _t((T, k)), _t((T, k), "i32")
    body = (f"%w, %i = moe.route %x bias(%b : {b}) k({k}) scoring(sigmoid) n_group({n_group}) "
            f"topk_group({topk_group}) renormalize(true) routed_scaling_factor({_f(scale)}) : {x} -> {o}, {oi}")
    return _func(name, [("x", x), ("b", b)], [o, oi], body, ["%w", "%i"])


def route_plan_deepseek_v3(name: str, T: int, E: int = 256, block: int = 64) -> str:
    """moe.route with DeepSeek-V3's attributes followed by moe.dispatch_plan of its picks (one host code on the
    GPU: Route.cpp lowers both, the four kernels back to back)."""
    k = 8
    x, b, o, oi = _t((T, E)), _t((E,)), _t((T, k)), _t((T, k), "i32")
    plan = [_t((E,), "i32"), _t((E + 1,), "i32"), _t((T * k,), "i32"), _t((T * k,), "i32"), "tensor<?xi32>",
            "tensor<?xi32>", _t((1,), "i32")]
    body = (f"%w, %i = moe.route %x bias(%b : {b}) k({k}) scoring(sigmoid) n_group(8) topk_group(4) "
            f"renormalize(true) routed_scaling_factor({_f(2.5)}) : {x} -> {o}, {oi}\n"
            f"  %c, %o, %ord, %inv, %p, %pb, %n = moe.dispatch_plan %i num_experts({E}) block_size({block}) : "
            f"{oi} -> {', '.join(plan)}")
    return _func(name, [("x", x), ("b", b)], [o, oi] + plan, body,
                 ["%w", "%i", "%c", "%o", "%ord", "%inv", "%p", "%pb", "%n"])


def module(funcs: Sequence[str]) -> str:
    return "\n".join(funcs)
