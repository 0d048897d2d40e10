"""Experts whose weights overflow (issue 79 item 5): a Qwen3-MoE block whose expert weights hold values up to ~3e38
under ``torch.compile(backend="moe")`` against eager.

The report: a bare ``Qwen3MoeSparseMoeBlock`` (transformers 5 leaves its experts ``torch.empty``) gave NaN under
backend "moe" where eager and inductor were finite; zeroing the values above 1e3 made all three equal.

The cause is the routing's tie rule, not the experts. A bare block's router is zero as well
(``Qwen3MoeTopKRouter.__init__``: ``torch.zeros``), so every token's 8 softmax scores are equal. ``torch.topk``
leaves the order of equal values unspecified (CPU ``nth_element``: E = 8, k = 2 gives experts 6, 5, whatever the
token); the raised ``moe.topk_renorm`` takes the lowest indices, 0 and 1, its documented rule (MoEOps.td; the raised
graph's ``torch.ops.moe.topk_renorm`` kernel). Both are top-k choices with the same weights (1/2 each), but they read
different experts: in the reported block's uninitialised memory experts 0 and 1 held NaN or huge values, which only
the moe choice read, hence NaN in every row; inductor keeps ``aten.topk`` and so eager's choice. Zeroing the
values above 1e3 left experts of (almost) all zeros, whose outputs are 0 whichever experts are chosen.

What is tested:

* :func:`test_overflowing_experts_match_eager`: with a router that does not tie, experts whose weights overflow in
  every way (a selected expert whose projection reaches ±inf and NaN, one whose output column overflows, one with
  finite values near 1e37, an expert no token selects filled with NaN and inf) give eager's outputs wherever eager's
  are finite and are non-finite exactly where eager's are (but the router's gradient, below), forward and backward
  (the input and every parameter), at T = 1, 7, 33, through each experts implementation the backend can meet:
  HF's eager loop (the default of a standalone block), transformers' ``grouped_mm`` (raised to
  ``moe_mlir::grouped_mm_ends``, the extension's kernel) and ``"moe"`` (``dispatch_experts`` ->
  ``moe_mlir::expert_mlp``, the extension's kernel, and its Python loop). No path computes an expert without rows
  or multiplies an unselected expert's output by a zero weight.
  One difference, in the router's gradient only: where a token's selected expert gives a non-finite output, eager's
  chain (softmax over all E, top-k, renormalisation) spreads the NaN to all E logits of that token (the softmax
  backward ``p_i (g_i - sum_j p_j g_j)`` sums the NaN into every logit, ``p_i = 0`` included), hence to every row
  of the router's weight gradient that such a token reaches; the raised ``moe.topk_renorm``'s backward is the closed
  form of the renormalised weights, which do not depend on the unselected logits: their gradient is 0. So the
  router's gradient is non-finite only where eager's is, not everywhere it is.
* :func:`test_bare_block_differs_from_eager_only_by_the_tie_choice`: the reported block. The raised router takes
  experts 0..k-1 on every tied row, eager another choice of equal weights, and the block's output under backend
  "moe" is HF's eager experts applied to the raised routing (NaN exactly where they are): nothing after the
  routing adds a NaN.

Equality to eager on the bare block itself is not asked of the backend: its scores all tie, torch.topk's choice
among ties is unspecified (CPU nth_element picks 6 and 5, CUDA others), and the dialect's documented rule is the
lowest index (MoEOps.td); eager's finite output there is an accident of which uninitialised experts it read.

Test time: ``dense="eager"`` (the same raising and the same experts ops, ``grouped_mm_ends`` and ``expert_mlp`` being
opaque custom ops that inductor would call as they are; AOTAutograd runs the rest uncompiled): inductor's C++
compile of each graph of the expert loop would cost seconds each on a 2-core machine.

Tolerance: the compiled paths sum in other orders than eager (the kernels' row sums, the grouped GEMMs' blocking,
the recomputed backward). Where products near 1e37 cancel, the rounding of an f32 sum is relative to its largest
term, not to its result, so the absolute tolerance is 1e-5 of the largest finite value of the tensor compared
(seen: up to 3e-8 of it); rtol 1e-5 as test_hf_experts.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import Qwen3MoeConfig  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3  # noqa: E402

import moe_mlir  # noqa: E402,F401 - registers the backend
from moe_mlir import experts as X  # noqa: E402
from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402
from moe_mlir.experts import common as XC  # noqa: E402

H, E, K, I = 64, 8, 2, 32
TOKENS = (1, 7, 33)  # the first compile is static, the second recompiles with a symbolic token count
HUGE = 3e38  # near f32's largest finite value (3.4e38): any product with it past 1.13 overflows
#: The expert no token selects (its router row sends its logit to about -1e3 or below).
UNSELECTED = 7


def _config() -> Qwen3MoeConfig:
    return Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                          norm_topk_prob=True)


def _overflowing_block() -> qwen3.Qwen3MoeSparseMoeBlock:
    """A block with a router that does not tie and experts that overflow (``x[:, 0] >= 0.1``: see :func:`_tokens`)."""
    g = torch.Generator().manual_seed(79)
    block = qwen3.Qwen3MoeSparseMoeBlock(_config())
    with torch.no_grad():
        for p, std in ((block.gate.weight, 0.5), (block.experts.gate_up_proj, 0.1), (block.experts.down_proj, 0.1)):
            p.copy_(torch.randn(p.shape, generator=g) * std)
        gate_up, down = block.experts.gate_up_proj, block.experts.down_proj
        sign = torch.tensor([1.0, -1.0]).repeat(I)
        gate_up[3, :, 5] = HUGE * sign  # gate and up reach +-inf: silu(-inf) = NaN, inf * up = +-inf
        down[5, 7, :] = HUGE            # output column 7 of expert 5 sums 32 products of ~1e38: +-inf
        gate_up[6, I + 8, :] = 1e37     # one up row near 1e37: finite outputs near 1e36 that cancel in sums
        block.gate.weight[UNSELECTED] = 0.0
        block.gate.weight[UNSELECTED, 0] = -1e4
        gate_up[UNSELECTED] = float("nan")
        down[UNSELECTED] = float("inf")
    return block


def _tokens(T: int) -> torch.Tensor:
    x = torch.randn(1, T, H, generator=torch.Generator().manual_seed(T))
    x[..., 0] = x[..., 0].abs() + 0.1  # the unselected expert's logit <= -1e3: its softmax score is 0
    return x


def assert_eager_where_finite(out: torch.Tensor, ref: torch.Tensor, what: str, *, same_nonfinite: bool = True) -> None:
    """``out`` equals ``ref`` wherever ``ref`` is finite (the tolerance: the module doc) and is non-finite only where
    ``ref`` is; with ``same_nonfinite``, wherever ``ref`` is too."""
    finite = torch.isfinite(ref)
    bad = torch.isfinite(out) != finite
    if not same_nonfinite:
        bad &= finite
    assert not bad.any(), (f"{what}: {int(bad.sum())} entries finite in one and not the other, e.g. at "
                           f"{bad.nonzero()[0].tolist()}: eager {ref[bad][0].item()}, moe {out[bad][0].item()}")
    if finite.any():
        scale = max(ref[finite].abs().max().item(), 1.0)
        torch.testing.assert_close(out[finite], ref[finite], rtol=1e-5, atol=1e-5 * scale,
                                   msg=lambda m: f"{what}: {m}")


def _run(fn, block: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor):
    """fn(x) and the gradients of x and of every parameter of ``block`` for the cotangent ``grad``."""
    block.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    out = fn(x)
    out.backward(grad)
    grads = {"x": x.grad, **{n: p.grad for n, p in block.named_parameters()}}
    block.zero_grad(set_to_none=True)
    return out.detach(), grads


#: (experts implementation, the extension's kernel for expert_mlp)
IMPLEMENTATIONS = {"hf_eager_loop": (None, True), "grouped_mm": ("grouped_mm", True), "moe": ("moe", True),
                   "moe_python_loop": ("moe", False)}


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_overflowing_experts_match_eager(name, monkeypatch):
    impl, native = IMPLEMENTATIONS[name]
    monkeypatch.setattr(XC, "NATIVE_MLP", native)
    X.register()
    block = _overflowing_block()
    experts_config = block.experts.config
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="moe", options={"dense": "eager"})
    seen_nonfinite = False
    with capture_graphs() as log:
        for T in TOKENS:
            x = _tokens(T)
            grad = torch.randn(1, T, H, generator=torch.Generator().manual_seed(100 + T))
            experts_config._experts_implementation = None  # eager: HF's loop
            ref, ref_grads = _run(block, block, x, grad)
            experts_config._experts_implementation = impl
            try:
                out, grads = _run(compiled, block, x, grad)
            finally:
                experts_config._experts_implementation = None
            assert_eager_where_finite(out, ref, f"T={T} output")
            for n in ref_grads:
                # The router's gradient may be finite where eager's is NaN (the module doc).
                assert_eager_where_finite(grads[n], ref_grads[n], f"T={T} grad {n}",
                                          same_nonfinite=n != "gate.weight")
            # The unselected expert's NaN and inf weights reach nothing (eager's gradient for them is 0).
            assert torch.equal(grads["experts.gate_up_proj"][UNSELECTED], torch.zeros(2 * I, H))
            seen_nonfinite |= not torch.isfinite(ref).all().item()
    assert seen_nonfinite, "the overflowing experts overflowed nowhere: the test lost its subject"
    assert sum(g.counts.get("topk_renorm", 0) for g in log) >= 1, "the router was not raised"


def _bare_block() -> tuple[qwen3.Qwen3MoeSparseMoeBlock, torch.Tensor]:
    """The reported block, reproducibly: a zero router (as HF builds it) and experts of small values except where
    the raised routing differs from eager's, which hold NaN and ~3e38 values (what the reported block's
    uninitialised memory held there). Returns the block and its tokens."""
    block = qwen3.Qwen3MoeSparseMoeBlock(_config())
    x = _tokens(7)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        assert torch.equal(block.gate.weight, torch.zeros(E, H))  # HF's own initialisation: every score ties
        for p in (block.experts.gate_up_proj, block.experts.down_proj):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        eager_choice = set(block.gate(x[0])[2].flatten().tolist())
        for e in sorted(set(range(K)) - eager_choice):  # the raised choice on tied rows: experts 0..k-1
            block.experts.gate_up_proj[e, :, ::3] = HUGE
            block.experts.down_proj[e, ::5, :] = float("nan")
    return block, x


def test_bare_block_differs_from_eager_only_by_the_tie_choice():
    block, x = _bare_block()
    T = x.shape[1]
    torch._dynamo.reset()
    with torch.no_grad():
        _, w_eager, i_eager = block.gate(x[0])
        _, w_moe, i_moe = torch.compile(block.gate, backend="moe", options={"dense": "eager"})(x[0])
        # The tie: the raised op takes the lowest indices, torch.topk another choice of the same weights.
        assert torch.equal(i_moe.long(), torch.arange(K).expand(T, K))
        assert not torch.equal(i_eager.sort(-1).values, i_moe.long()), "torch's top-k chose 0..k-1 too"
        torch.testing.assert_close(w_moe, w_eager)
        torch._dynamo.reset()
        out = torch.compile(block, backend="moe", options={"dense": "eager"})(x)
        # HF's eager experts on the raised routing: the block's output, NaN exactly where they are.
        ref = block.experts(x[0], i_moe.long(), w_moe).view(1, T, H)
    assert not torch.isfinite(ref).all(), "the experts of the raised choice should overflow (the report)"
    assert_eager_where_finite(out, ref, "bare block on the raised routing")

