"""Views and shape manipulation (value semantics: every view is a copy-free reshape or a new tensor).

Entries of :data:`moe_mlir.mlir.table.LOWERINGS` (:mod:`moe_mlir.mlir.lowerings`)."""

from __future__ import annotations

from typing import TYPE_CHECKING


from ..builder import Value
from ..table import lowering
from ._common import _norm_dim

if TYPE_CHECKING:  # pragma: no cover
    from ..importer import FxImporter


# ----------------------------------------------------------------------------------------------------------------
# Views and shape manipulation (value semantics: every view is a copy-free reshape or a new tensor)
# ----------------------------------------------------------------------------------------------------------------


@lowering("aten::view.default", "aten::_unsafe_view.default", "aten::reshape.default", "aten::view_copy.default",
          "aten::flatten.using_ints", "aten::unflatten.int", "aten::squeeze.dim", "aten::squeeze.dims",
          "aten::squeeze.default", "aten::unsqueeze.default", "aten::expand_as.default")
def _view(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    x = a["self"]
    if node.target._schema.name.endswith("expand_as"):
        return imp.broadcast_to(x, out.shape)
    return imp.reshape(x, out.shape)


@lowering("aten::permute.default", "aten::transpose.int", "aten::t.default", "aten::permute_copy.default",
          "aten::numpy_T.default")
def _permute(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    R = x.type.rank
    name = node.target._schema.name.split("::")[1]
    if name.startswith("permute"):
        perm = [d % R for d in a["dims"]]
    elif name == "transpose":
        d0, d1 = _norm_dim(a["dim0"], R), _norm_dim(a["dim1"], R)
        perm = list(range(R))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        perm = list(reversed(range(R)))
    return imp.transpose(x, perm)


@lowering("aten::expand.default", "aten::expand_copy.default", "aten::broadcast_to.default")
def _expand(imp: FxImporter, node, a: dict) -> Value:
    return imp.broadcast_to(a["self"], imp.out_type().shape)


@lowering("aten::slice.Tensor", "aten::slice_copy.Tensor", "aten::narrow.default")
def _slice(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    R = x.type.rank
    d = _norm_dim(a.get("dim", 0), R)
    n = x.type.shape[d]
    if node.target._schema.name.endswith("narrow"):
        start = a["start"] % n if a["start"] < 0 else a["start"]
        end, step = start + a["length"], 1
    else:
        start, end, step = a.get("start"), a.get("end"), a.get("step", 1) or 1
        start = 0 if start is None else start
        end = n if end is None else end
        start = max(min(start + n if start < 0 else start, n), 0)
        end = max(min(end + n if end < 0 else end, n), 0)
    out = imp.out_type()
    if out.shape == x.type.shape:
        return x
    offsets = [0] * R
    offsets[d] = start
    strides = [1] * R
    strides[d] = step
    return imp.extract_slice(x, offsets, out.shape, strides)


@lowering("aten::select.int", "aten::select_copy.int")
def _select(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    R = x.type.rank
    d = _norm_dim(a["dim"], R)
    i = a["index"]
    i = i + x.type.shape[d] if i < 0 else i
    offsets = [0] * R
    offsets[d] = i
    sizes = list(x.type.shape)
    sizes[d] = 1
    return imp.extract_slice(x, offsets, sizes, [1] * R, out_t=imp.out_type())


@lowering("aten::cat.default", "aten::concat.default", "aten::stack.default")
def _cat(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    tensors = [t for t in a["tensors"] if t.type.numel > 0 or node.target._schema.name.endswith("stack")]
    d = _norm_dim(a.get("dim", 0), out.rank)
    stack = node.target._schema.name.endswith("stack")
    dest = imp.b.empty(out)
    off = 0
    for t in tensors:
        t = imp.cast(t, out.elem)
        if stack:
            shape = list(t.type.shape)
            shape.insert(d, 1)
            t = imp.reshape(t, shape)
        offsets = [0] * out.rank
        offsets[d] = off
        dest = imp.insert_slice(t, dest, offsets)
        off += t.type.shape[d]
    return dest


@lowering("aten::split.Tensor", "aten::split_with_sizes.default", "aten::chunk.default", "aten::unbind.int",
          "aten::split_with_sizes_copy.default")
def _split(imp: FxImporter, node, a: dict) -> tuple:
    x = a["self"]
    R = x.type.rank
    d = _norm_dim(a.get("dim", 0), R)
    vals = node.meta["val"]
    outs = []
    off = 0
    unbind = node.target._schema.name.endswith("unbind")
    for i, v in enumerate(vals):
        t = imp.type_of_val(v, node)
        size = 1 if unbind else t.shape[d]
        offsets = [0] * R
        offsets[d] = off
        sizes = list(x.type.shape)
        sizes[d] = size
        outs.append(imp.extract_slice(x, offsets, sizes, [1] * R, out_t=t))
        off += size
    return tuple(outs)
