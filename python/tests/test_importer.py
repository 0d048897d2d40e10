"""The importer: every seed model and the raising idioms print MLIR that moe-opt parses and verifies, with the
expected ``moe`` ops; the raised FX graph computes what the model computes; unsupported ops fail clearly."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import moe_mlir
from moe_mlir.frontend.raising import raise_routing_idioms
from moe_mlir.mlir.importer import (LOWERINGS, MoEImportError, export_program, import_exported_program,
                                    import_model, import_program)
from moe_mlir.models import acmoe, attention_inform, hyper_router, similarity_inform, symphony

from conftest import assert_verifies, filecheck


def moe_ops(text: str) -> list[str]:
    return re.findall(r'"moe\.(\w+)"', text)


def run_exported(ep, args):
    """Calls the (possibly rewritten) graph module of ``ep`` with its parameters, buffers and constants."""
    gm = ep.graph_module
    specs = ep.graph_signature.input_specs
    user = iter(args)
    vals = []
    for s in specs:
        if s.kind.name == "USER_INPUT":
            vals.append(next(user))
        elif s.kind.name in ("PARAMETER", "BUFFER"):
            vals.append(ep.state_dict[s.target] if s.target in ep.state_dict else ep.constants[s.target])
        else:
            vals.append(ep.constants[s.target])
    out = gm(*vals)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Seed models
# ----------------------------------------------------------------------------------------------------------------

MODELS = {
    "similarity_inform": (similarity_inform, [r'"moe\.similarity_inform"\(.*\{causal = false, operandSegmentSizes = '
                                              r'array<i32: 1, 1, 0, 0>, tau = 1\.0+e\+00 : f32\}',
                                              r'"moe\.topk_renorm".*mode = #moe<topk_mode probs>, renormalize = true']),
    "attention_inform": (attention_inform, [r'"moe\.attention_posterior"\(.*head_select = #moe<head_select '
                                            r'min_entropy>', r'"moe\.topk_renorm".*topk_mode probs']),
    "hyper_router": (hyper_router, [r'"moe\.hyper_router"\(.*\{num_experts = 8 : i64\}',
                                    r'"moe\.topk_renorm".*mode = #moe<topk_mode logits>, renormalize = true']),
    "acmoe": (acmoe, [r'"moe\.topk_renorm".*topk_mode logits', r'"moe\.mad_dispersion"\(.*empty = #moe<empty '
                      r'identity>.*num_experts = 8 : i64', r'"moe\.topk_renorm".*topk_mode logits']),
    "symphony": (symphony, [r'"moe\.topk_renorm".*mode = #moe<topk_mode probs>, renormalize = false']),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_model_with_custom_ops_imports_and_verifies(name, moe_opt):
    mod, checks = MODELS[name]
    model, args = mod.example(use_custom_ops=True)
    text = import_model(model, args)
    filecheck(text, [r"func\.func @forward\(%arg0: tensor<2x8x32xf32>\) -> tensor<2x8x32xf32>"] + checks)
    assert_verifies(moe_opt, text)


RAISED = {
    "similarity_inform": ["similarity_inform", "topk_renorm"],
    "attention_inform": ["topk_renorm"],
    "hyper_router": ["topk_renorm"],
    "acmoe": ["topk_renorm", "topk_renorm"],
    "symphony": ["topk_renorm"],
}


@pytest.mark.parametrize("name", list(RAISED))
def test_model_in_plain_torch_is_raised(name, moe_opt):
    """The same models without our custom ops: the importer raises their routing idioms to moe ops."""
    mod, _ = MODELS[name]
    model, args = mod.example(use_custom_ops=False)
    text = import_model(model, args)
    assert sorted(moe_ops(text)) == sorted(RAISED[name])
    assert_verifies(moe_opt, text)


@pytest.mark.parametrize("name", list(MODELS))
def test_models_eager_custom_ops_match_plain_torch(name):
    """The custom-op and plain formulations of each model agree (same seed, same weights)."""
    mod, _ = MODELS[name]
    m1, args = mod.example(use_custom_ops=True)
    m2, _ = mod.example(use_custom_ops=False)
    m2.load_state_dict(m1.state_dict())
    torch.testing.assert_close(m1(*args), m2(*args), atol=2e-5, rtol=1e-4)


def test_hyper_router_folds_with_constant_weights(moe_opt):
    model, args = hyper_router.example()
    text = import_model(model, args)  # params="constant"
    assert "moe.hyper_router" in text
    folded = assert_verifies(moe_opt, text, "--canonicalize")
    assert "moe.hyper_router" not in folded  # App. C.4: generated once, stored
    prog = import_program(model, args, params="argument")
    assert [a.kind for a in prog.args].count("user_input") == 1
    assert any(a.target == "emb" for a in prog.args)
    kept = assert_verifies(moe_opt, prog.text, "--canonicalize")
    assert "moe.hyper_router" in kept  # emb is an argument: nothing folds


def test_symphony_training_graph_updates_the_adjacency(moe_opt):
    model, args = symphony.example()
    model.train()
    prog = import_program(model, args, eval_mode=False, params="argument")
    assert "moe.adjacency_update" in prog.text
    assert prog.result_kinds == ["buffer_mutation:adjacency", "user_output"]
    assert_verifies(moe_opt, prog.text)
    model.eval()
    assert "moe.adjacency_update" not in import_model(model, args)  # frozen at inference


def test_params_as_arguments_signature(moe_opt):
    model, args = similarity_inform.example()
    prog = import_program(model, args, params="argument")
    n_params = len(list(model.parameters())) + len(list(model.buffers()))
    assert len(prog.args) == n_params + 1
    assert "arith.constant dense<" not in prog.text.split("func.func")[1].split("\n")[1]
    assert_verifies(moe_opt, prog.text)


# ----------------------------------------------------------------------------------------------------------------
# Raising idioms, one at a time
# ----------------------------------------------------------------------------------------------------------------


class SoftmaxTopkRenorm(nn.Module):
    def forward(self, x):
        p = torch.softmax(x, dim=-1)
        v, i = torch.topk(p, 2, dim=-1)
        return v / v.sum(dim=-1, keepdim=True), i


class SoftmaxTopk(nn.Module):
    def forward(self, x):
        v, i = torch.softmax(x, -1).topk(3)
        return v, i


class TopkSoftmax(nn.Module):
    def forward(self, x):
        v, i = x.topk(2, dim=-1)
        return F.softmax(v, dim=-1), i


class TopkRenormProbs(nn.Module):
    def forward(self, p):
        v, i = p.topk(2, dim=-1)
        return v / v.sum(-1, keepdim=True), i


class MixedProbsTopk(nn.Module):
    """SymphonySMoE's gate: the top-k of ``softmax(logits) · Aᵀ``, raw values as weights."""

    def __init__(self, experts: int = 8):
        super().__init__()
        self.register_buffer("a", torch.rand(experts, experts))

    def forward(self, x):
        v, i = torch.topk(torch.softmax(x, -1) @ self.a.t(), 3, dim=-1)
        return v * 2.0, i


class TopkRaw(nn.Module):
    """A top-k of plain scores, values used raw: no routing idiom (the importer still lowers it to the op)."""

    def forward(self, x):
        v, i = torch.topk(x, 3, dim=-1)
        return v * 2.0, i


class SimilarityIdiom(nn.Module):
    def __init__(self, tau: float = 2.0, scale_by_mul: bool = False, rank2: bool = False):
        super().__init__()
        self.tau, self.mul, self.rank2 = tau, scale_by_mul, rank2

    def forward(self, u, e):
        g = u @ u.transpose(-1, -2)
        g = g * (1.0 / self.tau) if self.mul else g / self.tau
        return torch.softmax(g, dim=-1) @ e


class AttentionNotSimilarity(nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v


IDIOMS = [
    (SoftmaxTopkRenorm(), (torch.randn(4, 6, 8),),
     [r'"moe\.topk_renorm"\(%arg0\) \{k = 2 : i64, mode = #moe<topk_mode logits>, renormalize = true\}'], 1),
    (SoftmaxTopk(), (torch.randn(5, 8),),
     [r'"moe\.topk_renorm"\(%arg0\) \{k = 3 : i64, mode = #moe<topk_mode logits>, renormalize = false\}'], 1),
    (TopkSoftmax(), (torch.randn(2, 3, 8),),
     [r'"moe\.topk_renorm"\(%arg0\) \{k = 2 : i64, mode = #moe<topk_mode logits>, renormalize = true\}'], 1),
    (TopkRenormProbs(), (torch.rand(6, 8),),
     [r'"moe\.topk_renorm"\(%arg0\) \{k = 2 : i64, mode = #moe<topk_mode probs>, renormalize = true\}'], 1),
    (MixedProbsTopk(), (torch.randn(2, 5, 8),),
     [r'"moe\.topk_renorm"\(%\w+\) \{k = 3 : i64, mode = #moe<topk_mode probs>, renormalize = false\}'], 1),
    (MixedProbsTopk(), (torch.randn(7, 8),), [r'"moe\.topk_renorm".*mode = #moe<topk_mode probs>'], 1),
    (SimilarityIdiom(), (torch.randn(2, 5, 4), torch.rand(2, 5, 3)),
     [r'"moe\.similarity_inform"\(%arg0, %arg1\) \{causal = false, operandSegmentSizes = array<i32: 1, 1, 0, 0>, '
      r'tau = 2\.0+e\+00 : f32\}'], 1),
    (SimilarityIdiom(0.5, scale_by_mul=True), (torch.randn(2, 5, 4), torch.rand(2, 5, 3)),
     [r'"moe\.similarity_inform".*tau = 5\.0+e-01 : f32'], 1),
    (SimilarityIdiom(1.0), (torch.randn(5, 4), torch.rand(5, 3)), [r'"moe\.similarity_inform"'], 1),
    (AttentionNotSimilarity(), (torch.randn(2, 5, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 3)), [], 0),
]


@pytest.mark.parametrize("model,args,checks,n", IDIOMS, ids=lambda x: type(x).__name__ if isinstance(x, nn.Module) else "")
def test_raising_idiom(model, args, checks, n, moe_opt):
    text = import_model(model, args)
    assert len(moe_ops(text)) == n, text
    filecheck(text, checks)
    assert_verifies(moe_opt, text)
    assert len(moe_ops(import_model(model, args, raise_idioms=False))) == (1 if "topk" in str(checks) else 0)


@pytest.mark.parametrize("model,args,checks,n", IDIOMS, ids=lambda x: type(x).__name__ if isinstance(x, nn.Module) else "")
def test_raised_graph_computes_the_same(model, args, checks, n):
    """The rewritten FX graph (now calling torch.ops.moe.*) matches the model on random (tie-free) inputs."""
    ep = export_program(model, args)
    counts = raise_routing_idioms(ep.graph_module)
    assert sum(counts.values()) == n
    got = run_exported(ep, args)
    want = model(*args)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_plain_topk_is_not_a_routing_idiom():
    """A top-k of scores that are not mixed probabilities stays aten.topk in the FX graph."""
    ep = export_program(TopkRaw(), (torch.randn(4, 8),))
    assert sum(raise_routing_idioms(ep.graph_module).values()) == 0


def test_raised_weights_keep_their_dtype():
    ep = export_program(TopkSoftmax(), (torch.randn(3, 8).to(torch.bfloat16),))
    raise_routing_idioms(ep.graph_module)
    w, i = run_exported(ep, (torch.randn(3, 8).to(torch.bfloat16),))
    assert w.dtype == torch.bfloat16 and i.dtype == torch.int64


# ----------------------------------------------------------------------------------------------------------------
# A standard transformer block and the aten surface
# ----------------------------------------------------------------------------------------------------------------


class TransformerBlock(nn.Module):
    def __init__(self, d=16, h=4, ff=32):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.drop = nn.Dropout(0.1)
        self.h = h

    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(B, N, self.h, D // self.h).permute(0, 2, 1, 3) for t in (q, k, v))
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * (D // self.h) ** -0.5, dim=-1)
        y = torch.matmul(self.drop(att), v).transpose(1, 2).reshape(B, N, D)
        x = x + self.drop(self.proj(y))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


def test_standard_transformer_block_imports(moe_opt):
    text = import_model(TransformerBlock(), (torch.randn(2, 6, 16),))
    assert moe_ops(text) == []
    for op in ("linalg.matmul", "math.rsqrt", "math.exp", "math.erf"):
        assert op in text, op
    assert_verifies(moe_opt, text)


class AtenSurface(nn.Module):
    """One of (nearly) everything the lowerings cover, to check the printed forms parse and verify."""

    def forward(self, x, i, m):
        a = torch.gather(x, 1, i)
        b = torch.zeros_like(x).scatter(1, i, a)
        c = torch.zeros(4, 6).index_add(0, torch.tensor([0, 1, 1, 3]), x)
        d = torch.zeros(4, 6).index_reduce(0, torch.tensor([0, 1, 1, 3]), x, "mean", include_self=False)
        e = x.index_select(1, torch.tensor([5, 0]))
        f = x[:, 1:4].clamp(-0.5, 0.5).abs().exp().log().sqrt()
        g = torch.where(m, x, -x).masked_fill(~m, 0.0)
        h = torch.cat([x, x * 2], dim=0).reshape(2, 4, 6).permute(2, 0, 1).sum(-1).mean(0, keepdim=True)
        j = torch.log_softmax(x, dim=0).amax(dim=1) + x.max(dim=1).values + x.argmax(dim=0).float().sum()
        k = (x > 0).float() * (x <= 0.5).float() + (x != 0).to(torch.float32)
        n = torch.topk(x, 2, dim=0, largest=False).values.sum() + torch.stack([x, x], 1).var(-1).sum()
        o = torch.relu(x) + torch.sigmoid(x) * torch.tanh(x) - 1.0 / (1.0 + x.pow(2))
        p = torch.arange(6).float().unsqueeze(0).expand(4, 6) + torch.ones(4, 6).tril()
        q = torch.einsum("ij,kj->ik", x, x) + torch.bmm(x.unsqueeze(0), x.t().unsqueeze(0)).squeeze(0)
        r = x[torch.tensor([3, 0])] + torch.logsumexp(x, dim=1, keepdim=True)[:2]
        return a, b, c, d, e, f, g, h, j, k, n, o, p, q, r


def test_aten_surface_imports_and_verifies(moe_opt):
    x = torch.randn(4, 6)
    i = torch.randint(0, 6, (4, 2))
    m = torch.rand(4, 6) > 0.5
    text = import_model(AtenSurface(), (x, i, m))
    filecheck(text, [r"scf\.for", r"tensor\.insert", r"tensor\.extract_slice", r"linalg\.transpose"])
    assert_verifies(moe_opt, text)


def test_dispatch_table_keys_are_schema_names():
    assert "aten::linear.default" in LOWERINGS and "aten::add.Tensor" in LOWERINGS
    for name in moe_mlir.ops.OP_NAMES:
        assert f"moe::{name}.default" in LOWERINGS
    for key in LOWERINGS:
        assert re.fullmatch(r"(aten|moe)::\w+\.\w+", key), key


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------


class Unsupported(nn.Module):
    def forward(self, x):
        y = x * 2
        return torch.cumsum(y, dim=-1)  # UNSUPPORTED-LINE


def test_unsupported_op_names_op_and_source_line():
    with pytest.raises(MoEImportError) as info:
        import_model(Unsupported(), (torch.randn(3, 4),))
    msg = str(info.value)
    assert "unsupported op 'aten::cumsum.default'" in msg
    line = next(n for n, l in enumerate(open(__file__).read().splitlines(), 1) if l.endswith("# UNSUPPORTED-LINE"))
    assert f"test_importer.py:{line} (in forward)" in msg


def test_dynamic_shapes_are_rejected_clearly():
    m = SoftmaxTopk()
    ep = torch.export.export(m, (torch.randn(5, 8),), dynamic_shapes=({0: torch.export.Dim("n")},))
    with pytest.raises(MoEImportError, match="dynamic dimension"):
        import_exported_program(ep)


def test_training_dropout_is_rejected():
    class D(nn.Module):
        def forward(self, x):
            return F.dropout(x, 0.5, training=True)

    with pytest.raises(MoEImportError):
        import_model(D(), (torch.randn(3, 3),))
