"""The imported IR is what runs: after raising, ``import_model`` prints no dead op (#33 item 4).

HF transformers' DeepseekV3TopkRouter, raised to one ``moe.route``, used to import as ~60 ops, 50 of them its
group-mask computation (top-k of the group scores, a scatter loop, an expand), kept alive by the export's impure
``_assert_tensor_metadata`` check of the dead mask. Now it imports as its weights, its linear (transpose, fill,
matmul), the ``moe.route`` and the i32 -> i64 cast of the indices it returns, nothing else; and the module still
computes what the router computes (the whole-graph path, when the build has the tools).
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek  # noqa: E402

import moe_mlir  # noqa: E402
from moe_mlir.mlir.importer import eliminate_dead_code, export_program  # noqa: E402
from torch_checks import init_hf_module, same_expert_sets  # noqa: E402

H = 32

#: The ops of forward's body (one per line at the body's indentation; region bodies are deeper).
_BODY_OP = re.compile(r'^    (?:%[\w:#]+ = )?"?([a-z_]+\.[a-z_]+)"?', re.M)


def body_ops(text: str) -> list[str]:
    return _BODY_OP.findall(text)


def _router(E: int, n_group: int, topk_group: int, k: int):
    cfg = DeepseekV3Config(hidden_size=H, moe_intermediate_size=16, n_routed_experts=E, num_experts_per_tok=k,
                           n_group=n_group, topk_group=topk_group, n_shared_experts=1, norm_topk_prob=True,
                           routed_scaling_factor=2.5)
    return init_hf_module(deepseek.DeepseekV3TopkRouter(cfg), seed=E + n_group)


#: The linear's ops, the route, the cast of its indices to the router's i64 (the weights are constants before them).
_LINEAR = ["tensor.empty", "linalg.transpose", "arith.constant", "tensor.empty", "linalg.fill", "linalg.matmul"]
_ROUTE = ["moe.route", "tensor.empty", "linalg.generic", "func.return"]


@pytest.mark.parametrize("E,n_group,topk_group,k", [(24, 1, 1, 4), (32, 8, 3, 4)], ids=["n_group=1", "n_group=8"])
@pytest.mark.parametrize("params", ["constant", "argument"])
def test_deepseek_v3_router_imports_as_its_linear_and_one_route(E, n_group, topk_group, k, params):
    router = _router(E, n_group, topk_group, k)
    text = moe_mlir.import_model(router, (torch.randn(5, H),), params=params)
    ops = [o if o != "return" else "func.return" for o in body_ops(text.replace("    return ", "    func.return "))]
    weights = ["arith.constant"] * 2 if params == "constant" else []
    assert ops == weights + _LINEAR + _ROUTE, "\n".join(ops)
    route = re.search(r'"moe\.route"\(%\w+, %\w+\) \(\{\s*\}\) \{([^}]*)\}', text)  # its empty score region
    assert route is not None, text
    attrs = route.group(1)
    for want in (f"n_group = {n_group} : i64", f"topk_group = {topk_group} : i64", f"k = {k} : i64",
                 "scoring = #moe<scoring sigmoid>", "renormalize = true"):
        assert want in attrs, attrs
    # The region of the one linalg.generic is the cast, nothing of the group mask.
    assert "arith.extsi" in text and not re.search(r"scf\.for|tensor\.insert|moe\.topk_renorm", text), text


def test_eliminate_dead_code_keeps_checks_of_live_values():
    """A check of a value that is used stays (only checks of dead values go), and running the graph again erases
    nothing more."""
    router = _router(24, 1, 1, 4)
    ep = export_program(router, (torch.randn(5, H),))
    graph = ep.graph_module.graph
    checks = [n for n in graph.nodes if "assert_tensor_metadata" in str(n.target)]
    assert checks, "the export has no dtype checks any more: this test checks nothing"
    erased = eliminate_dead_code(graph)  # unraised: every node is live
    assert erased == 0
    assert eliminate_dead_code(graph) == 0


def test_imported_router_computes_the_router(moe_opt):
    """The pruned module, compiled by the whole-graph path, equals the eager router (n_group 8)."""
    from moe_mlir.backends.cpu import ExecutorLibrary

    if ExecutorLibrary.find() is None:
        pytest.skip("libMoEExecutorC.so not found (the whole-graph executor)")
    router = _router(32, 8, 3, 4)
    x = torch.randn(5, H)
    compiled = moe_mlir.compile(router, (x,), backend="executor")
    with torch.no_grad():
        logits, w, i = compiled(x)
        logits_e, w_e, i_e = router(x)
    torch.testing.assert_close(logits, logits_e)
    assert i.dtype == i_e.dtype == torch.int64
    same_expert_sets(w, i, w_e, i_e)
