"""A torch op added through the torch part of docs/Contributing.md's "A new op" checklist and nothing else.

The op module's pieces only: the custom op, whose CPU implementation runs the kernel of its key through
``moe_mlir.runtime.launch.call_kernel`` (no C++ glue in lib/Runtime/Torch), its fake kernel, its ``KEY_OPS`` entry
(the whole-graph importer), on keys whose ops ODS, the lowering table and include/MoE/IR/KernelKeys.td already have
(the C++ steps of the checklist, tested by lit: test/Dialect/MoE/kernel-key.mlir, test/Tools/). In a fresh
interpreter: the ops are defined in the ``moe`` namespace, and the importer registers its lowerings at import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from torch_checks import needs_cpu_kernels

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import torch
from torch import Tensor

import moe_mlir.ops  # noqa: F401  (the op modules)
from moe_mlir.ops._verified_op import moe_op
from moe_mlir.ops.loading import KEY_OPS
from moe_mlir.runtime import cache
from moe_mlir.runtime.launch import call_kernel


# The op module of a new router loss: its torch op runs the compiled kernel of its key, and moe_op makes the kernel
# and the fake kernel check each call with the key's op verifier.
def _z_loss_fake(logits):
    return logits.new_empty((), dtype=torch.float32)


@moe_op("checklist_z_loss", key="router_z_loss", fake=_z_loss_fake)
def checklist_z_loss(logits: Tensor) -> Tensor:
    out = logits.new_empty((), dtype=torch.float32)
    call_kernel("router_z_loss", {"logits": logits}, [out], dynamic={"logits": (0,)})
    return out


@torch.library.custom_op("moe::checklist_topk", mutates_args=())
def checklist_topk(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    shape = (*scores.shape[:-1], k)
    w = scores.new_empty(shape, dtype=torch.float32)
    idx = scores.new_empty(shape, dtype=torch.int32)
    args = {"scores": scores.reshape(-1, scores.shape[-1]), "k": k, "mode": "probs", "renormalize": True}
    call_kernel("topk_renorm", args, [w.view(-1, k), idx.view(-1, k)], dynamic={"scores": (0,)})
    return w, idx


@checklist_topk.register_fake
def _(scores, k):
    shape = (*scores.shape[:-1], k)
    return scores.new_empty(shape, dtype=torch.float32), scores.new_empty(shape, dtype=torch.int32)


KEY_OPS["checklist_z_loss"] = "router_z_loss"


# An index the kernel finds out of range: the extension's error, and the next call is clean.
def adjacency(a, idx):
    out = torch.empty_like(a)
    call_kernel("adjacency_update", {"a": a, "idx": idx, "beta": 0.9, "norm": "row", "include_self": True}, [out],
                dynamic={"idx": (0,)})
    return out


try:
    adjacency(torch.eye(6), torch.tensor([[0, 1], [2, 99]], dtype=torch.int32))
except ValueError as e:
    assert "moe.adjacency_update: 'idx' holds 99, outside [0, 6)" in str(e), str(e)
else:
    raise AssertionError("no error for an index out of range")
idx = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
torch.testing.assert_close(adjacency(torch.eye(6), idx), torch.ops.moe.adjacency_update(torch.eye(6), idx))

g = torch.Generator().manual_seed(0)
for t in (1, 7, 300):
    x = torch.randn(t, 12, generator=g) * 3
    ref = torch.logsumexp(x, -1).square().mean()
    got = torch.ops.moe.checklist_z_loss(x)
    assert got.dtype == torch.float32 and got.shape == ()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
# One kernel for every token count: T is dynamic in the key.
zkeys = [k for k in cache.stats.keys if k.startswith("router_z_loss|")]
assert zkeys == ["router_z_loss|in:logits:f32:?x12"], cache.stats.keys

# Ties to the lowest index, a NaN ranks first, k = K; bf16 scores.
p = torch.tensor([[0.1, 0.4, 0.4, 0.1], [0.2, float("nan"), 0.3, 0.5]])
w, idx = torch.ops.moe.checklist_topk(p, 2)
assert idx.tolist() == [[1, 2], [1, 3]], idx
torch.testing.assert_close(w[0], torch.tensor([0.5, 0.5]))
assert torch.isnan(w[1]).all()
s = torch.rand(3, 5, 6, generator=g).bfloat16()
w, idx = torch.ops.moe.checklist_topk(s, 6)
v, ref_idx = torch.topk(s.float(), 6, dim=-1)
assert torch.equal(idx.long(), ref_idx), (idx, ref_idx)
torch.testing.assert_close(w, v / v.sum(-1, keepdim=True))

# A bad call: the kernel cache's validator of the key, before any kernel runs.
for bad, msg in ((lambda: torch.ops.moe.checklist_z_loss(torch.randn(4)), "'logits' must have rank 2"),
                 (lambda: torch.ops.moe.checklist_topk(torch.rand(2, 4), 5), "'k' (5) must be in [1, 4]")):
    try:
        bad()
    except ValueError as e:
        assert msg in str(e), str(e)
    else:
        raise AssertionError("no error for " + msg)

# The whole-graph importer lowers the new torch op to its key's op (its KEY_OPS entry).
from moe_mlir.mlir.importer import import_model


class M(torch.nn.Module):
    def forward(self, x):
        return torch.ops.moe.checklist_z_loss(x * 2)


text = import_model(M(), (torch.randn(5, 8),))
assert '"moe.router_z_loss"(' in text, text
print("ok")
"""


@needs_cpu_kernels
def test_a_torch_op_from_its_ops_module_alone(tmp_path):
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT, MOE_KERNEL_CACHE=str(tmp_path / "cache"))
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout + p.stderr
