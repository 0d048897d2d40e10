"""The fused forms' torch ops (ops/fused.py) are derived from their mixing op's definition: their schema is the
mixing op's plus the gate's ``k`` and ``renormalize``, their fake kernel the mixing op's with ``p`` replaced by the
gate's weights and indices. These pin what users see of that derivation."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import moe_mlir  # noqa: F401  (registers torch.ops.moe.*)


def test_fused_schemas_are_the_mixing_ops_plus_the_gate():
    assert str(torch.ops.moe.similarity_inform_topk.default._schema) == (
        "moe::similarity_inform_topk(Tensor u, Tensor e, SymInt k, Tensor? ws=None, Tensor? key_mask=None, "
        "float tau=1., bool causal=False, bool renormalize=True) -> (Tensor, Tensor)")
    assert str(torch.ops.moe.attention_posterior_topk.default._schema) == (
        "moe::attention_posterior_topk(Tensor scores, Tensor u, Tensor v, Tensor wo, Tensor e, SymInt k, "
        "float sigma=1., str head_select=\"min_entropy\", float? head_scale=None, bool renormalize=True) "
        "-> (Tensor, Tensor, Tensor)")


def test_fused_fake_kernels_give_the_gates_results_then_the_mixing_ops_others():
    with FakeTensorMode():
        u, e = torch.empty(2, 5, 8), torch.empty(2, 5, 6)
        w, i = torch.ops.moe.similarity_inform_topk(u, e, 3)
        assert (w.shape, w.dtype, i.shape, i.dtype) == ((2, 5, 3), torch.float32, (2, 5, 3), torch.int32)
        B, H, N, Nk, D, Dh, K = 2, 4, 5, 7, 16, 8, 6
        scores, u = torch.empty(B, H, N, Nk), torch.empty(B, N, D)
        v, wo, e = torch.empty(B, H, Nk, Dh), torch.empty(D, H * Dh), torch.empty(B, Nk, K)
        w, i, head = torch.ops.moe.attention_posterior_topk(scores, u, v, wo, e, 2)
        assert (w.shape, w.dtype, i.shape, i.dtype) == ((B, N, 2), torch.float32, (B, N, 2), torch.int32)
        assert (head.shape, head.dtype) == ((B,), torch.int32)


def test_fused_result_is_the_mixing_op_then_the_gate():
    g = torch.Generator().manual_seed(0)
    u, e = torch.randn(1, 6, 8, generator=g), torch.softmax(torch.randn(1, 6, 5, generator=g), -1)
    w, i = torch.ops.moe.similarity_inform_topk(u, e, 2, None, None, 0.5, True, False)
    p = torch.ops.moe.similarity_inform(u, e, None, None, 0.5, True)
    top = torch.topk(p, 2, dim=-1)
    torch.testing.assert_close(w, top.values, rtol=1e-5, atol=1e-6)
    assert torch.equal(i.long(), top.indices)
