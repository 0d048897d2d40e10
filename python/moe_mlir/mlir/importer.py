"""torch.export -> MLIR text: the importer of MoE-MLIR.

Structured like torch-mlir's FX importer (``python/torch_mlir/extras/fx_importer.py``), but it *prints* MLIR (the
distro has no MLIR Python bindings) and lowers ATen straight to upstream dialects instead of the ``torch`` dialect:

1. :func:`export_program`: ``torch.export.export`` of the model in eval mode, then ``run_decompositions`` with the
   default table *minus* every op this importer lowers itself (so ``linear``, ``softmax``, ``layer_norm``,
   ``matmul``... stay whole, which keeps the printed IR small and the raising patterns simple).
2. :mod:`moe_mlir.frontend.raising`: pattern rewrites on the FX graph (softmax->topk->renormalize and topk->softmax become
   ``moe.topk_renorm``; ``softmax(U Uᵀ/τ) E`` becomes ``moe.similarity_inform``).
3. :class:`FxImporter`: the *signature walk* (``graph_signature.input_specs``: user inputs, parameters, buffers,
   lifted constants; ``output_specs``), the *dtype table* (:data:`moe_mlir.runtime.abi.MLIR_ELEM`) and the *dispatch
   table* :data:`LOWERINGS`, keyed ``"aten::name.overload"`` (``"moe::topk_renorm.default"``...), each entry printing
   ``linalg``/``tensor``/``arith``/``math``/``scf`` (or a ``moe`` op in the generic form).

Parameters and buffers: ``params="constant"`` (the default, for inference) prints each as an ``arith.constant``
dense literal (raw hex, exact), so the compiled function depends on the user inputs only and ``moe-opt
--canonicalize`` can fold what depends on weights alone: that is what turns ``moe.hyper_router`` into two constants
(HyperRouter App. C.4: the router is generated once). ``params="argument"`` makes them leading function arguments
instead (one module for any weights, e.g. a training step, at the price of no folding). Lifted tensor constants are
always literals.

Shapes are static (the example inputs fix them). An op with no entry in :data:`LOWERINGS` raises
:class:`MoEImportError` naming the op and the user's source line (``node.meta["stack_trace"]``).
"""

from __future__ import annotations

import functools
import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from .. import ops as _ops  # noqa: F401  (registers torch.ops.moe.*)
from ..frontend.export import export_program as _export
from ..frontend.raising import raise_routing_idioms
from .builder import Builder, TensorType, Value, affine_map, format_float, identity_map, is_float, mlir_elem
from .table import LOWERINGS, Lowering, lowering, op_key  # noqa: F401

__all__ = [
    "MoEImportError",
    "ArgSpec",
    "ImportedProgram",
    "export_program",
    "import_program",
    "import_model",
    "import_exported_program",
    "eliminate_dead_code",
    "LOWERINGS",
    "op_key",
]


class MoEImportError(NotImplementedError):
    """An FX node the importer cannot lower (unsupported op, dynamic shape, dtype...)."""


# ----------------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class ArgSpec:
    """One argument of the printed function."""

    name: str  # the FX placeholder
    kind: str  # "user_input" | "parameter" | "buffer" | "constant"
    target: Optional[str]  # state_dict key for parameters/buffers
    type: TensorType


@dataclass
class ImportedProgram:
    """The printed module and what a caller needs to run it."""

    text: str
    func_name: str
    args: list[ArgSpec]
    results: list[TensorType]
    #: For each result: "user_output" or "buffer_mutation:<target>" (training-mode buffer updates).
    result_kinds: list[str] = field(default_factory=list)
    #: Parameter/buffer values when ``params="argument"`` (in argument order), to call the function.
    param_values: dict[str, torch.Tensor] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.text


# ----------------------------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------------------------


def _lowered_whole(op: Any) -> bool:
    """The ops the importer lowers itself: the export keeps them whole (no decomposition)."""
    _lowerings.moe_ops.register_key_ops()
    return op_key(op) in LOWERINGS


#: :func:`moe_mlir.frontend.export.export_program`, keeping whole every op the importer lowers itself.
export_program = functools.partial(_export, keep=_lowered_whole)


def import_program(
    model: torch.nn.Module,
    example_args: Sequence[Any],
    example_kwargs: Optional[dict[str, Any]] = None,
    *,
    func_name: str = "forward",
    params: str = "constant",
    raise_idioms: bool = True,
    eval_mode: bool = True,
) -> ImportedProgram:
    """Exports ``model`` on ``example_args`` and prints it as ``func.func @<func_name>`` (see the module doc).

    Args:
        model: any ``torch.nn.Module`` whose ops the importer lowers (see :data:`LOWERINGS`).
        example_args: example inputs; their shapes and dtypes become the function signature.
        params: ``"constant"`` (weights as ``arith.constant`` literals; folds at compile time) or ``"argument"``
            (weights as leading function arguments).
        raise_idioms: rewrite the routing idioms into ``moe`` ops before printing (:mod:`moe_mlir.frontend.raising`).
        eval_mode: export the model in eval mode (its training flag is restored afterwards).

    Raises:
        MoEImportError: an op, dtype or dynamic shape the importer cannot lower; the message names the op and the
            source line of the model that produced it.
    """
    ep = export_program(model, example_args, example_kwargs, eval_mode=eval_mode)
    return import_exported_program(ep, func_name=func_name, params=params, raise_idioms=raise_idioms)


def import_model(model: torch.nn.Module, example_args: Sequence[Any], example_kwargs: Optional[dict[str, Any]] = None,
                 **options: Any) -> str:
    """The MLIR text of ``model`` (in eval mode by default) traced on ``example_args``: a module with
    ``func.func @forward``. ``options``: the keyword arguments of :func:`import_program` (``func_name``, ``params``, ``raise_idioms``,
    ``eval_mode``), documented there."""
    return import_program(model, example_args, example_kwargs, **options).text


def import_exported_program(
    ep: ExportedProgram, *, func_name: str = "forward", params: str = "constant", raise_idioms: bool = True
) -> ImportedProgram:
    """Prints an already exported (and decomposed) program."""
    if params not in ("constant", "argument"):
        raise ValueError(f"params must be 'constant' or 'argument', got {params!r}")
    if raise_idioms:
        raise_routing_idioms(ep.graph_module)
    eliminate_dead_code(ep.graph_module.graph)
    return FxImporter(ep, func_name=func_name, params=params).run()


#: The ops the importer prints nothing for: checks of facts of the trace (a dtype, a size range).
_CHECKS = frozenset(("aten::_assert_tensor_metadata.default", "aten::_assert_scalar.default",
                     "aten::sym_constrain_range_for_size.default", "aten::_assert_async.msg"))


def _is_check(node: fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and \
        op_key(node.target) in _CHECKS


def eliminate_dead_code(graph: fx.Graph) -> int:
    """Erases the nodes no output (or side effect) needs, so that the imported IR is what runs; returns how many.

    ``fx.Graph.eliminate_dead_code`` keeps impure nodes, and the export's checks (``_assert_tensor_metadata`` of a
    dtype cast) are impure: a check of a value nothing else reads kept its whole chain alive (the group mask of a
    DeepSeek-V3 router after raising replaced its top-k with ``moe.route``: 50 dead ops). Here a check lives only
    while what it checks does."""
    live: set[fx.Node] = set()
    stack = [n for n in graph.nodes
             if n.op == "output" or (n.op == "call_function" and not _is_check(n) and n.is_impure())]
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(n.all_input_nodes)
    erased = 0
    for n in reversed(list(graph.nodes)):
        if n.op in ("placeholder", "output") or n in live:
            continue
        if _is_check(n) and all(i in live for i in n.all_input_nodes):
            continue
        graph.erase_node(n)
        erased += 1
    return erased


# ----------------------------------------------------------------------------------------------------------------
# The importer
# ----------------------------------------------------------------------------------------------------------------

_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def user_frame(node: fx.Node) -> Optional[tuple[str, int, str]]:
    """The innermost frame of ``node``'s stack trace that is not torch's own: (file, line, function)."""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME_RE.findall(trace)
    for f, line, fn in reversed(frames):
        if "/torch/" not in f:
            return f, int(line), fn
    if frames:
        f, line, fn = frames[-1]
        return f, int(line), fn
    return None


def describe_source(node: fx.Node) -> str:
    frame = user_frame(node)
    if frame is not None:
        return f'{frame[0]}:{frame[1]} (in {frame[2]})'
    return "<unknown source: the node has no stack trace>"


class FxImporter:
    """Prints one ``func.func`` for an :class:`~torch.export.ExportedProgram`."""

    def __init__(self, ep: ExportedProgram, *, func_name: str = "forward", params: str = "constant") -> None:
        self.ep = ep
        self.gm = ep.graph_module
        self.func_name = func_name
        self.params = params
        self.b = Builder()
        self.env: dict[fx.Node, Any] = {}
        self.node: Optional[fx.Node] = None  # the node being lowered (for error messages)

    # -- errors ---------------------------------------------------------------------------------------------------
    def error(self, msg: str, node: Optional[fx.Node] = None) -> MoEImportError:
        node = node or self.node
        if node is None:
            return MoEImportError(msg)
        key = op_key(node.target) if node.op == "call_function" else node.op
        return MoEImportError(f"{msg}\n  op: {key} (FX node '{node.name}')\n  at: {describe_source(node)}")

    # -- types ----------------------------------------------------------------------------------------------------
    def type_of_val(self, val: Any, node: Optional[fx.Node] = None) -> TensorType:
        if not isinstance(val, torch.Tensor):
            raise self.error(f"expected a tensor value, got {type(val).__name__}", node)
        shape = []
        for s in val.shape:
            if not isinstance(s, int):
                raise self.error(
                    f"dynamic dimension {s} in shape {list(val.shape)}: the importer handles static shapes only "
                    "(export without dynamic_shapes)",
                    node,
                )
            shape.append(s)
        try:
            return TensorType.of(shape, val.dtype)
        except NotImplementedError as e:
            raise self.error(str(e), node) from None

    def type_of(self, node: fx.Node, index: Optional[int] = None) -> TensorType:
        val = node.meta.get("val")
        if val is None:
            raise self.error("the node has no meta['val'] (was the graph produced by torch.export?)", node)
        if index is not None:
            val = val[index]
        return self.type_of_val(val, node)

    # -- values ---------------------------------------------------------------------------------------------------
    def value(self, arg: Any) -> Value:
        if isinstance(arg, fx.Node):
            v = self.env.get(arg)
            if not isinstance(v, Value):
                raise self.error(f"'{arg.name}' is not a tensor value here ({type(v).__name__})")
            return v
        raise self.error(f"expected a tensor operand, got {arg!r}")

    def resolve(self, arg: Any) -> Any:
        """FX argument -> Value / python value (lists resolved element-wise)."""
        if isinstance(arg, fx.Node):
            return self.env[arg]
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.resolve(a) for a in arg)
        return arg

    # -- the walk -------------------------------------------------------------------------------------------------
    def run(self) -> ImportedProgram:
        sig = self.ep.graph_signature
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        specs = {s.arg.name: s for s in sig.input_specs}
        state = self.ep.state_dict
        constants = getattr(self.ep, "constants", {}) or {}

        args: list[ArgSpec] = []
        param_values: dict[str, torch.Tensor] = {}
        literal_inputs: list[tuple[fx.Node, torch.Tensor]] = []
        for ph in placeholders:
            spec = specs.get(ph.name)
            kind = spec.kind if spec is not None else InputKind.USER_INPUT
            if kind == InputKind.USER_INPUT:
                val = ph.meta.get("val")
                if not isinstance(val, torch.Tensor):
                    raise self.error(f"user input '{ph.name}' is not a tensor ({type(val).__name__}): only tensor "
                                     "inputs are supported (bake scalars into the model)", ph)
                t = self.type_of(ph)
                args.append(ArgSpec(ph.name, "user_input", None, t))
                continue
            target = spec.target
            if kind in (InputKind.PARAMETER, InputKind.BUFFER):
                tensor = state.get(target)
                if tensor is None:  # non-persistent buffer
                    tensor = constants.get(target)
            elif kind == InputKind.CONSTANT_TENSOR:
                tensor = constants[target]
            else:
                raise self.error(f"unsupported input kind {kind} for '{ph.name}'", ph)
            if tensor is None:
                raise self.error(f"no value for {kind.name.lower()} '{target}'", ph)
            tensor = tensor.detach()
            if self.params == "argument" and kind in (InputKind.PARAMETER, InputKind.BUFFER):
                t = TensorType.of(tensor.shape, tensor.dtype)
                args.append(ArgSpec(ph.name, kind.name.lower(), target, t))
                param_values[ph.name] = tensor
            else:
                literal_inputs.append((ph, tensor))

        # Arguments get names %argN in argument order.
        by_name = {a.name: i for i, a in enumerate(args)}
        for ph in placeholders:
            if ph.name in by_name:
                i = by_name[ph.name]
                self.env[ph] = Value(f"%arg{i}", args[i].type)
        for ph, tensor in literal_inputs:
            if ph.users:  # a weight only dead code read prints nothing
                self.env[ph] = self.b.dense_constant(tensor, TensorType.of(tensor.shape, tensor.dtype))

        results: list[Value] = []
        kinds: list[str] = []
        out_specs = sig.output_specs
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                outs = node.args[0]
                outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
                for i, o in enumerate(outs):
                    if o is None:
                        continue
                    v = self.env.get(o) if isinstance(o, fx.Node) else None
                    if not isinstance(v, Value):
                        raise self.error(f"output {i} is not a tensor ({o!r})", node)
                    results.append(v)
                    spec = out_specs[i] if i < len(out_specs) else None
                    if spec is not None and spec.kind == OutputKind.BUFFER_MUTATION:
                        kinds.append(f"buffer_mutation:{spec.target}")
                    else:
                        kinds.append("user_output")
                continue
            if node.op == "get_attr":
                attr = getattr(self.gm, node.target)
                if isinstance(attr, torch.Tensor):
                    self.env[node] = self.b.dense_constant(attr.detach(), TensorType.of(attr.shape, attr.dtype))
                    continue
                raise self.error(f"get_attr of a {type(attr).__name__} is not supported", node)
            if node.op != "call_function":
                raise self.error(f"FX node kind '{node.op}' is not supported", node)
            self.lower_node(node)

        # Results that are function arguments or constants still print fine: `return %arg0`.
        sig_args = ", ".join(f"%arg{i}: {a.type}" for i, a in enumerate(args))
        res_types = ", ".join(str(v.type) for v in results)
        head = f"func.func @{self.func_name}({sig_args})"
        if results:
            head += f" -> ({res_types})" if len(results) != 1 else f" -> {res_types}"
        body = self.b.lines
        ret = f"  return {', '.join(v.name for v in results)} : {res_types}" if results else "  return"
        text = "module {\n" + "\n".join(["  " + head + " {"] + ["  " + l for l in body] + ["  " + ret, "  }"]) + "\n}\n"
        return ImportedProgram(
            text=text,
            func_name=self.func_name,
            args=args,
            results=[v.type for v in results],
            result_kinds=kinds,
            param_values=param_values,
        )

    def lower_node(self, node: fx.Node) -> None:
        self.node = node
        frame = user_frame(node)
        self.b.loc = f'loc("{frame[0]}":{frame[1]}:0)' if frame else None
        target = node.target
        if target is operator.getitem:
            src = self.env[node.args[0]]
            self.env[node] = src[node.args[1]]
            return
        key = op_key(target)
        if key.startswith("moe::") and key not in LOWERINGS:
            _lowerings.moe_ops.register_key_ops()
        fn = LOWERINGS.get(key)
        if fn is None:
            raise self.error(f"unsupported op '{key}': no lowering to linalg/tensor/arith/math or the moe dialect")
        bound = self.bind(node)
        try:
            out = fn(self, node, bound)
        except MoEImportError:
            raise
        except NotImplementedError as e:
            raise self.error(f"cannot lower '{key}': {e}") from None
        self.env[node] = out
        self.b.loc = None

    def bind(self, node: fx.Node) -> dict[str, Any]:
        """The node's arguments by schema name, with defaults filled in (values resolved)."""
        schema = node.target._schema
        out: dict[str, Any] = {}
        for i, a in enumerate(schema.arguments):
            if i < len(node.args):
                out[a.name] = node.args[i]
            elif a.name in node.kwargs:
                out[a.name] = node.kwargs[a.name]
            elif a.has_default_value():
                out[a.name] = a.default_value
            else:
                out[a.name] = None
        return {k: self.resolve(v) for k, v in out.items()}

    # ============================================================================================================
    # Building blocks
    # ============================================================================================================

    def out_type(self, index: Optional[int] = None) -> TensorType:
        return self.type_of(self.node, index)

    def broadcast_map(self, src: tuple[int, ...], dst: tuple[int, ...]) -> str:
        r, R = len(src), len(dst)
        if r > R:
            raise self.error(f"cannot broadcast shape {list(src)} to {list(dst)}")
        res: list[Union[int, str]] = []
        for i, s in enumerate(src):
            d = R - r + i
            if s == dst[d]:
                res.append(d)
            elif s == 1:
                res.append("0")
            else:
                raise self.error(f"cannot broadcast shape {list(src)} to {list(dst)}")
        return affine_map(R, res)

    def elementwise(
        self,
        out: TensorType,
        operands: Sequence[Union[Value, bool, int, float]],
        compute: str,
        fn: Callable[[Builder, list[str]], str],
        fn_elem: Optional[str] = None,
    ) -> Value:
        """``out[i] = cast(fn(cast(op_0[i]), ...))`` with numpy broadcasting; python scalars become constants.

        ``compute``: the element type the operands are converted to; ``fn_elem``: the element type ``fn`` returns
        (default ``compute``), converted to ``out.elem``.
        """
        tensors = [o for o in operands if isinstance(o, Value)]
        ins = [(v, self.broadcast_map(v.type.shape, out.shape)) for v in tensors]
        init = self.b.empty(out)

        def body(b: Builder, args: list[str]) -> str:
            it = iter(args)
            vals = []
            for o in operands:
                if isinstance(o, Value):
                    vals.append(b.cast(next(it), o.type.elem, compute))
                else:
                    vals.append(b.const(o, compute))
            r = fn(b, vals)
            return b.cast(r, fn_elem or compute, out.elem)

        return self.b.generic(ins, [(init, identity_map(out.rank))], ["parallel"] * out.rank, body)[0]

    def cast(self, v: Value, elem: str) -> Value:
        if v.type.elem == elem:
            return v
        return self.elementwise(v.type.with_elem(elem), [v], v.type.elem, lambda b, a: a[0])

    def reduce(
        self,
        x: Value,
        dims: Sequence[int],
        keepdim: bool,
        init: Union[bool, int, float],
        combine: Callable[[Builder, str, str], str],
        acc_elem: str,
        out_elem: Optional[str] = None,
    ) -> Value:
        """Reduces ``x`` over ``dims`` (``acc = combine(acc, cast(x))`` in ``acc_elem``, init ``init``)."""
        R = x.type.rank
        dims = sorted({d % R for d in dims}) if R else []
        out_shape = [1 if i in dims else s for i, s in enumerate(x.type.shape) if keepdim or i not in dims]
        acc_t = TensorType(tuple(out_shape), acc_elem)
        out_map = affine_map(R, ["0" if i in dims else i for i in range(R) if keepdim or i not in dims])
        acc = self.b.filled(init, acc_t)
        its = ["reduction" if i in dims else "parallel" for i in range(R)]

        def body(b: Builder, a: list[str]) -> str:
            return combine(b, a[1], b.cast(a[0], x.type.elem, acc_elem))

        r = self.b.generic([(x, identity_map(R))], [(acc, out_map)], its, body)[0]
        return self.cast(r, out_elem) if out_elem and out_elem != acc_elem else r

    def acc_elem(self, elem: str) -> str:
        """Float reductions accumulate in f32 (f64 stays f64)."""
        return "f64" if elem == "f64" else ("f32" if is_float(elem) else elem)

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(s) for s in shape)
        if x.type.shape == shape:
            return x
        if math.prod(shape) != x.type.numel:
            raise self.error(f"cannot reshape {list(x.type.shape)} to {list(shape)}")
        flat = x
        if x.type.rank != 1:
            ft = x.type.with_shape((x.type.numel,) if shape else ())
            if x.type.rank == 0:
                name = self.b.assign(f"tensor.expand_shape {x.name} [] output_shape [1] : {x.type} into {ft}")
            else:
                reassoc = "[" + ", ".join(str(i) for i in range(x.type.rank)) + "]" if ft.rank else ""
                name = self.b.assign(f"tensor.collapse_shape {x.name} [{reassoc}] : {x.type} into {ft}")
            flat = Value(name, ft)
        if flat.type.shape == shape:
            return flat
        out_t = x.type.with_shape(shape)
        name = self.b.fresh()
        if len(shape) == 0:
            self.b.emit(f"{name} = tensor.collapse_shape {flat.name} [] : {flat.type} into {out_t}")
        else:
            reassoc = "[" + ", ".join(str(i) for i in range(len(shape))) + "]"
            dims = ", ".join(str(s) for s in shape)
            self.b.emit(
                f"{name} = tensor.expand_shape {flat.name} [{reassoc}] output_shape [{dims}] : {flat.type} into {out_t}"
            )
        return Value(name, out_t)

    def transpose(self, x: Value, perm: Sequence[int]) -> Value:
        R = x.type.rank
        perm = [p % R for p in perm] if R else []
        if perm == list(range(R)):
            return x
        out_t = x.type.with_shape([x.type.shape[p] for p in perm])
        init = self.b.empty(out_t)
        name = self.b.fresh()
        self.b.emit(
            f"{name} = linalg.transpose ins({x.name} : {x.type}) outs({init.name} : {out_t}) "
            f"permutation = [{', '.join(map(str, perm))}]"
        )
        return Value(name, out_t)

    def broadcast_to(self, x: Value, shape: Sequence[int]) -> Value:
        shape = tuple(shape)
        if x.type.shape == shape:
            return x
        return self.elementwise(TensorType(shape, x.type.elem), [x], x.type.elem, lambda b, a: a[0])

    def extract_slice(self, x: Value, offsets: Sequence[int], sizes: Sequence[int], strides: Sequence[int],
                      out_t: Optional[TensorType] = None) -> Value:
        out_t = out_t or x.type.with_shape(sizes)
        name = self.b.fresh()
        self.b.emit(
            f"{name} = tensor.extract_slice {x.name}[{', '.join(map(str, offsets))}] [{', '.join(map(str, sizes))}] "
            f"[{', '.join(map(str, strides))}] : {x.type} to {out_t}"
        )
        return Value(name, out_t)

    def insert_slice(self, src: Value, dest: Value, offsets: Sequence[int]) -> Value:
        name = self.b.fresh()
        ones = ", ".join("1" for _ in src.type.shape)
        self.b.emit(
            f"{name} = tensor.insert_slice {src.name} into {dest.name}[{', '.join(map(str, offsets))}] "
            f"[{', '.join(map(str, src.type.shape))}] [{ones}] : {src.type} into {dest.type}"
        )
        return Value(name, dest.type)

    def contract(self, a: Value, b: Value, a_dims: str, b_dims: str, out_dims: str, out: TensorType) -> Value:
        """A general contraction (einsum ``a_dims,b_dims->out_dims``) as one ``linalg.generic`` (f32 accumulation
        for f16/bf16, cast to ``out.elem`` afterwards)."""
        letters = list(dict.fromkeys(out_dims + a_dims + b_dims))
        sizes: dict[str, int] = {}
        for dims, v in ((a_dims, a), (b_dims, b)):
            for ch, s in zip(dims, v.type.shape):
                if sizes.setdefault(ch, s) != s:
                    if s == 1 or sizes[ch] == 1:
                        raise self.error(f"broadcasting in a contraction ('{a_dims},{b_dims}->{out_dims}') is not supported")
                    raise self.error(f"size mismatch for '{ch}' in '{a_dims},{b_dims}->{out_dims}'")
        n = len(letters)
        pos = {ch: i for i, ch in enumerate(letters)}
        acc_e = self.acc_elem(out.elem)
        acc = self.b.filled(0, out.with_elem(acc_e))
        its = ["parallel" if ch in out_dims else "reduction" for ch in letters]

        def body(bb: Builder, args: list[str]) -> str:
            x = bb.cast(args[0], a.type.elem, acc_e)
            y = bb.cast(args[1], b.type.elem, acc_e)
            return bb.binary("add", args[2], bb.binary("mul", x, y, acc_e), acc_e)

        r = self.b.generic(
            [(a, affine_map(n, [pos[c] for c in a_dims])), (b, affine_map(n, [pos[c] for c in b_dims]))],
            [(acc, affine_map(n, [pos[c] for c in out_dims]))],
            its,
            body,
        )[0]
        return self.cast(r, out.elem)

    def matmul2d(self, a: Value, b: Value, out_elem: str) -> Value:
        """``linalg.matmul`` (f32 accumulation for f16/bf16)."""
        M, K = a.type.shape
        _, N = b.type.shape
        acc_e = self.acc_elem(out_elem)
        acc = self.b.filled(0, TensorType((M, N), acc_e))
        name = self.b.fresh()
        self.b.emit(
            f"{name} = linalg.matmul ins({a.name}, {b.name} : {a.type}, {b.type}) outs({acc.name} : {acc.type}) -> {acc.type}"
        )
        return self.cast(Value(name, acc.type), out_elem)

    def batch_matmul(self, a: Value, b: Value, out_elem: str) -> Value:
        B, M, K = a.type.shape
        _, _, N = b.type.shape
        acc_e = self.acc_elem(out_elem)
        acc = self.b.filled(0, TensorType((B, M, N), acc_e))
        name = self.b.fresh()
        self.b.emit(
            f"{name} = linalg.batch_matmul ins({a.name}, {b.name} : {a.type}, {b.type}) outs({acc.name} : {acc.type}) -> {acc.type}"
        )
        return self.cast(Value(name, acc.type), out_elem)

    def matmul(self, a: Value, b: Value, out: TensorType) -> Value:
        """torch.matmul semantics (1-D operands, broadcast batch dims)."""
        ra, rb = a.type.rank, b.type.rank
        if ra == 2 and rb == 2:
            return self.matmul2d(a, b, out.elem)
        if ra == 3 and rb == 3 and a.type.shape[0] == b.type.shape[0]:
            return self.batch_matmul(a, b, out.elem)
        if ra == 1 and rb == 1:
            return self.contract(a, b, "k", "k", "", out)
        letters = "abcdefghijlmnopqrstuvw"
        if ra == 1:
            a2 = self.reshape(a, (1, a.type.shape[0]))
            r = self.matmul(a2, b, out.with_shape(tuple(b.type.shape[:-2]) + (1, b.type.shape[-1])))
            return self.reshape(r, out.shape)
        if rb == 1:
            b2 = self.reshape(b, (b.type.shape[0], 1))
            r = self.matmul(a, b2, out.with_shape(tuple(a.type.shape[:-1]) + (1,)))
            return self.reshape(r, out.shape)
        batch = out.rank - 2
        bl = letters[:batch]

        def operand(v: Value) -> tuple[Value, str]:
            vb = v.type.rank - 2
            shape = tuple(out.shape[:batch]) + tuple(v.type.shape[-2:])
            if tuple(v.type.shape[:vb]) != tuple(out.shape[batch - vb: batch]) or vb != batch:
                v = self.broadcast_to(v, shape)
            return v, bl

        a_, _ = operand(a)
        b_, _ = operand(b)
        return self.contract(a_, b_, bl + "mk", bl + "kn", bl + "mn", out)

    def softmax(self, x: Value, dim: int, out_elem: str, log: bool = False) -> Value:
        """(log_)softmax over ``dim`` in f32 (max-subtracted), with torch's semantics (an all ``-inf`` slice is NaN)."""
        dim = dim % x.type.rank if x.type.rank else 0
        acc = self.acc_elem(x.type.elem)
        xf = self.cast(x, acc)
        mx = self.reduce(xf, [dim], True, float("-inf"), lambda b, a, v: b.binary("max", a, v, acc), acc)
        sh = self.elementwise(xf.type, [xf, mx], acc, lambda b, a: b.binary("sub", a[0], a[1], acc))
        ex = self.elementwise(xf.type, [sh], acc, lambda b, a: b.unary("exp", a[0], acc))
        sm = self.reduce(ex, [dim], True, 0.0, lambda b, a, v: b.binary("add", a, v, acc), acc)
        if log:
            return self.elementwise(
                x.type.with_elem(out_elem), [sh, sm], acc,
                lambda b, a: b.binary("sub", a[0], b.unary("log", a[1], acc), acc),
            )
        return self.elementwise(x.type.with_elem(out_elem), [ex, sm], acc, lambda b, a: b.binary("div", a[0], a[1], acc))

    def index_loops(
        self,
        bounds: Sequence[int],
        carried: Sequence[Value],
        body: Callable[[list[str], list[str]], list[str]],
    ) -> list[Value]:
        """An ``scf.for`` nest over ``bounds`` carrying tensors; ``body(ivs, accs)`` returns the new accs."""
        b = self.b
        c0, c1 = b.const_index(0), b.const_index(1)
        ubs = [b.const_index(n) for n in bounds]
        ivs: list[str] = []
        opened: list[tuple[str, int]] = []
        accs = [v.name for v in carried]
        types = ", ".join(str(v.type) for v in carried)
        for ub in ubs:
            iv = b.fresh("i")
            new_accs = [b.fresh("acc") for _ in carried]
            res = b.fresh("for")
            head = f"{res}:{len(carried)}" if len(carried) > 1 else res
            iters = ", ".join(f"{na} = {a}" for na, a in zip(new_accs, accs))
            b.emit(f"{head} = scf.for {iv} = {c0} to {ub} step {c1} iter_args({iters}) -> ({types}) {{")
            b.indent += 2
            ivs.append(iv)
            opened.append((res, len(carried)))
            accs = new_accs
        outs = body(ivs, accs)
        for res, n in reversed(opened):
            b.emit(f"scf.yield {', '.join(outs)} : {types}")
            b.indent -= 2
            b.emit("}")
            outs = [f"{res}#{i}" for i in range(n)] if n > 1 else [res]
        return [Value(o, v.type) for o, v in zip(outs, carried)]

    def extract(self, t: Value, coords: Sequence[str]) -> str:
        return self.b.assign(f"tensor.extract {t.name}[{', '.join(coords)}] : {t.type}")

    def insert(self, scalar: str, t: str, tt: TensorType, coords: Sequence[str]) -> str:
        return self.b.assign(f"tensor.insert {scalar} into {t}[{', '.join(coords)}] : {tt}")

    def clamp_index(self, b: Builder, idx_index: str, size: int, wrap_negative: bool = False) -> str:
        """Index clamped to ``[0, size)`` so that compiled code never reads or writes out of bounds (torch raises
        there; compiled code cannot, so an out-of-range index reads the nearest element)."""
        if wrap_negative:
            zero = b.const_index(0)
            neg = b.assign(f"arith.cmpi slt, {idx_index}, {zero} : index")
            n = b.const_index(size)
            added = b.assign(f"arith.addi {idx_index}, {n} : index")
            sel = b.assign(f"arith.select {neg}, {added}, {idx_index} : index")
            idx_index = sel
        lo, hi = b.const_index(0), b.const_index(max(size - 1, 0))
        m1 = b.assign(f"arith.maxsi {idx_index}, {lo} : index")
        m2 = b.assign(f"arith.minsi {m1}, {hi} : index")
        return m2

    def moe_op(self, name: str, operands: Sequence[Value], attrs: Union[dict[str, str], str],
               result_types: Sequence[TensorType], regions: Sequence[str] = ()) -> list[Value]:
        """A ``moe`` op in the generic form (the contract of DIALECT.md); ``attrs``: by name, or one printed
        dictionary (the compiler's, lowerings/moe_ops.py); ``regions``: the bodies of its regions (``^bb0(...): ...``,
        moe.route's custom score)."""
        res = self.b.fresh()
        n = len(result_types)
        head = f"{res}:{n}" if n > 1 else res
        if isinstance(attrs, str):
            attr = attrs.strip()[1:-1]
        else:
            attr = ", ".join(f"{k} = {v}" for k, v in sorted(attrs.items()))  # sorted, as MLIR prints them
        in_types = ", ".join(str(v.type) for v in operands)
        out_types = ", ".join(str(t) for t in result_types)
        out_types = f"({out_types})" if n > 1 else out_types
        loc = f" {self.b.loc}" if self.b.loc else ""
        self.b.emit(
            f'{head} = "{name}"({", ".join(v.name for v in operands)})'
            + "".join(f" ({{ {r} }})" for r in regions)
            + f' {{{attr}}} : ({in_types}) -> {out_types}{loc}'
        )
        if n == 1:
            return [Value(res, result_types[0])]
        return [Value(f"{res}#{i}", t) for i, t in enumerate(result_types)]


# ================================================================================================================
# Lowerings: the dispatch table
# ================================================================================================================

from . import lowerings as _lowerings  # noqa: E402,F401  (fills LOWERINGS)
