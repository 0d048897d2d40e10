"""Tensor creation: constants, fills, ranges, empty tensors.

Entries of :data:`moe_mlir.mlir.table.LOWERINGS` (:mod:`moe_mlir.mlir.lowerings`)."""

from __future__ import annotations

from typing import TYPE_CHECKING


from ..builder import Builder, Value, affine_map, identity_map
from ..table import lowering

if TYPE_CHECKING:  # pragma: no cover
    from ..importer import FxImporter


# ----------------------------------------------------------------------------------------------------------------
# Creation
# ----------------------------------------------------------------------------------------------------------------


@lowering("aten::full.default", "aten::zeros.default", "aten::ones.default", "aten::empty.memory_format",
          "aten::full_like.default", "aten::zeros_like.default", "aten::ones_like.default", "aten::empty_like.default",
          "aten::new_zeros.default", "aten::new_ones.default", "aten::new_full.default", "aten::new_empty.default",
          "aten::scalar_tensor.default", "aten::empty_strided.default")
def _full(imp: FxImporter, node, a: dict) -> Value:
    name = node.target._schema.name.split("::")[1]
    out = imp.out_type()
    if "fill_value" in a and a["fill_value"] is not None:
        v = a["fill_value"]
    elif name.startswith(("ones", "new_ones")):
        v = 1
    elif name == "scalar_tensor":
        v = a["s"]
    else:
        v = 0  # zeros, and `empty` (its contents are unspecified; zeros are as good as any)
    if isinstance(v, Value):
        raise NotImplementedError("a fill value computed at run time")
    return imp.b.filled(v, out)


@lowering("aten::arange.default", "aten::arange.start", "aten::arange.start_step")
def _arange(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    start = a.get("start", 0) if "start" in a else 0
    step = a.get("step", 1) or 1
    comp = out.elem

    def body(b: Builder, args: list[str]) -> str:
        i = b.linalg_index(0)
        iv = b.to_int(i, "i64")
        x = b.cast(iv, "i64", comp)
        return b.binary("add", b.const(start, comp), b.binary("mul", x, b.const(step, comp), comp), comp)

    init = imp.b.empty(out)
    return imp.b.generic([], [(init, identity_map(1))], ["parallel"], body)[0]


@lowering("aten::tril.default", "aten::triu.default")
def _tri(imp: FxImporter, node, a: dict) -> Value:
    upper = "triu" in node.target._schema.name
    x = a["self"]
    k = a.get("diagonal", 0) or 0
    out = imp.out_type()
    R = out.rank

    def body(b: Builder, args: list[str]) -> str:
        r = b.to_int(b.linalg_index(R - 2), "i64")
        c = b.to_int(b.linalg_index(R - 1), "i64")
        d = b.binary("sub", c, r, "i64")
        keep = b.cmp("ge" if upper else "le", d, b.const(k, "i64"), "i64")
        return b.select(keep, args[0], b.const(0, out.elem), out.elem)

    init = imp.b.empty(out)
    return imp.b.generic([(x, identity_map(R))], [(init, identity_map(R))], ["parallel"] * R, body)[0]


@lowering("aten::one_hot.default")
def _one_hot(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    out = imp.out_type()
    R = out.rank

    def body(b: Builder, args: list[str]) -> str:
        c = b.to_int(b.linalg_index(R - 1), x.type.elem)
        return b.cast(b.cmp("eq", args[0], c, x.type.elem), "i1", out.elem)

    init = imp.b.empty(out)
    return imp.b.generic([(x, affine_map(R, list(range(R - 1))))], [(init, identity_map(R))], ["parallel"] * R, body)[0]
