"""A small SIMT interpreter of convert-moe-to-gpu's kernels, for checking a kernel's code without a GPU: the
gpu.func of `moe-opt --convert-moe-to-gpu --mlir-print-op-generic` (arith, math, memref, scf, gpu.shuffle, nvvm
vote/redux/warp barrier, the 16-byte load's inline assembly, the SFU intrinsics) run one warp at a time in lockstep
on numpy arrays of 32 lanes. Divergent scf.if runs both branches under lane masks; loops must be warp-uniform
(the kernels' are: every lane reaches every shuffle), except loops without carried values, whose lanes may start
at their own bounds (a block's threads striding over a tile: each lane runs its own trips, masked). Global memory
is numpy arrays (f16/bf16 held as their bits), shared memory one array per block. ex2.approx and rcp.approx are
modelled as exact f32 2^x and 1/x: the interpreter checks the kernel's data movement and selection, not the SFU's
ulps.

The tensor-core flash kernel (FlashMma.cpp) runs with `lockstep=True`: every thread of a block in one lockstep
group (so gpu.barrier and cp.async's wait are points every thread has reached with every earlier write done;
a missing barrier goes unseen: racecheck's on a GPU), or, for a kernel whose warps take loops of their own
between barriers, with `warp_threads=True` (a thread a warp, gpu.barrier a barrier of them); cp.async copies land
at their issue or, with `async_copies="wait"`, only at the wait that completes their group (a read before that
wait sees the old data); shuffles and votes within each 32-lane warp, and
the warp-level ops per warp: nvgpu.ldmatrix (x1/x2/x4, .trans), nvgpu.mma.sync (f16) and nvvm.mma.sync (bf16; and m16n8k8 tf32)
m16n8k16 (products exact, sums in float64 rounded to f32: the tensor cores' own summation order is not
modelled), nvgpu.device_async_copy (zero fill past src-size), memref.subview (unit strides), memref.collapse_shape and memref.view of
gpu.dynamic_shared_memory, llvm.mlir.poison (zeros), vector from_elements/extract/insert/bitcast/
load/store, arith.truncf to f16/bf16 (round to nearest even). Vectors are arrays (lanes, *shape); f16/bf16
values are their bits (uint16) throughout. memref.atomic_rmw addf (lanes in order).
The dispatch plan's kernels (DispatchPlan.cpp) add nvvm.match.sync (any), math.ctpop/cttz and the error word's
llvm.inttoptr, cmpxchg (lanes in order), getelementptr and store on a global int64 buffer (Memory.add); its scan
kernel (a block of 256 threads with barriers) runs with `lockstep=True`.

%nsmid (nvvm.read.ptx.sreg.nsmid, the flash kernels' causal block order) is `SMS`, or run_kernel's `sms`.

Only what the route, top-k, dispatch-plan and flash-mma kernels use is implemented; an unknown op raises.

Speed (the GPU unit tests are most of lit's CPU time): each block is decoded once, at its first run, into a plan
(_plan: per op its handler, what the handler reads off the op's text bound into it, its operand and result
names), so the hot loops run no regex and no chain of name tests; numpy's error state is set once per warp, not per
op; values are never written in place, so handlers return views and cached constants without copying; the
lane-by-lane ops (ldmatrix, mma.sync's fragments, cp.async, vector.load/store, the 16-byte loads, stores to
distinct elements) move all their lanes with one numpy index where every lane is in bounds and no two lanes'
elements meet, and fall back to the lane loop (which says what is wrong) otherwise; run_kernel and parse run with
Python's cyclic garbage collector paused (_gc_paused).
"""
import functools
import gc
import os
import re
import subprocess
import threading

import numpy as np

LANES = 32
_TERMINATORS = frozenset(("scf.yield", "scf.condition", "gpu.return"))


def find_moe_opt():
    """The moe-opt that emits the kernels under test: $MOE_OPT, else the build's; None where there is none."""
    path = os.environ.get("MOE_OPT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                                     "build", "bin", "moe-opt")
    return path if os.path.exists(path) else None


def _gc_paused(f):
    """`f` run with Python's cyclic garbage collector off (and back on after, where it was on). The interpreter
    allocates a numpy array or two per op and parse() an object per op, few of them in reference cycles; the
    collector, counting those allocations, ran its full collections over the whole heap (torch's objects, the
    parsed kernels) again and again: 3.3-3.6 of 20 CPU s in 14 kernel tests, half of it here (the rest at the
    tests' collection and torch's import; bench/results/test-time-2026-11-30-gpu-lit.md). Reference counting
    still frees every array at once; cycles made meanwhile are collected once the collector is back on."""
    @functools.wraps(f)
    def paused(*args, **kwargs):
        was = gc.isenabled()
        gc.disable()
        try:
            return f(*args, **kwargs)
        finally:
            if was:
                gc.enable()
    return paused


_WORKGROUP = re.compile(r"memref<([\dx]+)x(bf16|f16|f32), #gpu.address_space<workgroup>>")
_WORKGROUP_DTYPES = {"bf16": np.uint16, "f16": np.uint16, "f32": np.float32}


def workgroup_buffers(text, kernel):
    """The workgroup buffers of `kernel` in `lower`'s text, as its entry block declares them: [(shape, numpy dtype)],
    16-bit floats as their bits (np.uint16), what run()'s `workgroup=` takes."""
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if '"gpu.func"' in line and f'sym_name = "{kernel}"' in next(x for x in lines[n:] if 'sym_name = "' in x):
            head = next(x for x in lines[n:] if "^bb0(" in x)
            return [(tuple(int(d) for d in dims.split("x")), _WORKGROUP_DTYPES[t])
                    for dims, t in _WORKGROUP.findall(head)]
    raise KeyError(kernel)


@functools.lru_cache(maxsize=32)
def lower(moe_opt, text, options=""):
    """`text` through `moe-opt --convert-moe-to-gpu=OPTIONS --mlir-print-op-generic` (what parse() reads). Cached:
    the tests' parametrizations lower the same text with the same options again (the flash kernel's split counts,
    its copy timings), and moe-opt's output is a function of them."""
    return subprocess.run([moe_opt, "-", f"--convert-moe-to-gpu={options}", "--mlir-print-op-generic"],
                          input=text, capture_output=True, text=True, check=True).stdout

OP = re.compile(r'^\s*(?:(?P<res>%[^=]+?) = )?"(?P<name>[\w.]+)"\((?P<args>[^)]*)\)(?P<rest>.*)$')
BLOCK = re.compile(r"^\s*\^bb\d+(?:\((?P<args>.*)\))?:\s*$")


class Op:
    """One op of the parsed text. `cache`: what the interpreter reads off its text (a position, a predicate, a
    type's shape, a splat constant), worked out at its first run and kept (_static): the regexes cost more than
    the numpy work of the hot loops' vector.extract and mma.sync, which run hundreds of thousands of times."""
    __slots__ = ("name", "results", "args", "props", "types", "regions", "cache")

    def __init__(self, name, results, args, props, types):
        self.name, self.results, self.args, self.props, self.types = name, results, args, props, types
        self.regions = []
        self.cache = {}


class _Block(list):
    """A block's ops (parse()), with the plan that Warp.run_block runs them by (_plan), made at its first run."""
    __slots__ = ("plan",)

    def __init__(self, *args):
        super().__init__(*args)
        self.plan = None


def _plan(ops):
    """How Warp.run_block runs `ops`: per op (handler, op, operand names, result names, whether it ends the
    block), the handler taking (warp, op, operand values, mask): the op's entry of _HOT, with what it reads off
    the op's text bound where that is all it needs (_BOUND), else Warp._step."""
    plan = []
    for op in ops:
        bind = _BOUND.get(op.name)
        if bind is not None:
            run = bind(op)
        elif op.name in _HOT:
            run = _HOT[op.name]
        elif op.name in _SCF:
            run = Warp._scf
        elif op.name in _STEP_MMA:
            run = _step_mma
        else:
            run = Warp._step
        fast = None
        if op.name in _FAST and len(op.results) == 1:
            fast = _FAST[op.name](op, tuple(op.args), op.results[0])
        plan.append((fast, run, op, tuple(op.args), tuple(op.results), op.name in _TERMINATORS))
    return tuple(plan)


def _static(op, key, make):
    """`make(op)`, a function of op's text only, computed once per op (Op.cache)."""
    try:
        return op.cache[key]
    except KeyError:
        v = op.cache[key] = make(op)
        return v


def _results(res):
    if not res:
        return []
    if ":" not in res and "," not in res:      # one result (most ops)
        return [res.strip()]
    out = []
    for part in res.split(", "):
        m = re.match(r"(%[\w.$-]+)(?::(\d+))?$", part.strip())
        name, n = m.group(1), m.group(2)
        out += [f"{name}#{i}" for i in range(int(n))] if n else [name]
    return out


def _type_list(s):
    s = s.strip()
    if s.startswith("(") and s.endswith(")"):
        s = s[1:-1]
    if "," not in s:                            # one type (most ops' results)
        s = s.strip()
        return [s] if s else []
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _signature(rest):
    """The result types of an op line's trailing `: (operands) -> results`."""
    i = rest.rfind(" -> ")
    if i < 0:
        return []
    return _type_list(rest[i + 4:])


@functools.lru_cache(maxsize=16)
@_gc_paused
def parse(text, func_name):
    """The body (a list of blocks: (arg names, ops)) of gpu.func `func_name`. Cached (the bodies are read-only to
    the interpreter, Op.cache aside): parametrized cases run the same kernel on other inputs or grids, and parsing
    a flash kernel's module takes about as long as running a small case."""
    lines = text.splitlines()
    pos = [0]

    def parse_regions(first_rest):
        regions = []
        blocks = []
        cur_args, cur_ops = [], _Block()
        started = False
        while True:
            line = lines[pos[0]]
            pos[0] += 1
            s = line.strip()
            m = BLOCK.match(line)
            if m:
                if started:
                    blocks.append((cur_args, cur_ops))
                cur_args = [a.split(":")[0].strip() for a in _type_list(m.group("args") or "")]
                cur_ops, started = _Block(), True
                continue
            if s.startswith("}"):
                if started or cur_ops:
                    blocks.append((cur_args, cur_ops))
                regions.append(blocks)
                blocks, cur_args, cur_ops, started = [], [], _Block(), False
                if s.startswith("}, {"):
                    continue
                return regions, s
            op = parse_op(line)
            cur_ops.append(op)
            started = True

    def parse_op(line):
        m = OP.match(line)
        if not m:
            raise ValueError(f"cannot parse: {line}")
        rest = m.group("rest")
        args = [a.strip() for a in m.group("args").split(",") if a.strip()]
        props = rest
        op = Op(m.group("name"), _results(m.group("res")), args, props, [])
        if rest.rstrip().endswith("({"):
            op.regions, closing = parse_regions(rest)
            op.types = _signature(closing)
            op.props = rest + " " + closing
        else:
            op.types = _signature(rest)
        return op

    while pos[0] < len(lines):
        line = lines[pos[0]]
        pos[0] += 1
        if '"gpu.func"' in line:
            # Another kernel of the module (its closing line, at the gpu.func's own indentation, names it):
            # skipped unparsed, the flash modules' kernels being thousands of ops each.
            indent = line[:len(line) - len(line.lstrip())]
            end = next((j for j in range(pos[0], len(lines))
                        if lines[j].startswith(indent + "}") and not lines[j].startswith(indent + "} ")), None)
            if end is not None and 'sym_name = "' in lines[end] and f'sym_name = "{func_name}"' not in lines[end]:
                pos[0] = end + 1
                continue
            regions, closing = parse_regions(line)
            if f'sym_name = "{func_name}"' in closing:
                return regions[0]
    raise KeyError(func_name)


def _prop(op, key):
    m = re.search(key + r" = ([^,}>]+(?:<[^>]*>)?)", op.props)
    return m.group(1).strip() if m else None


def _int_type(t):
    return {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
            "index": np.int64}.get(t)


@functools.lru_cache(maxsize=None)
def _vector_shape(t):
    """(shape, element type) of a `vector<4x2xbf16>` type, or None for a scalar."""
    m = re.match(r"vector<((?:\d+x)+)(\w+)>$", t)
    if not m:
        return None
    return tuple(int(d) for d in m.group(1).rstrip("x").split("x")), m.group(2)


def _f32_to_bits(x, t):
    """f32 values rounded to nearest even into f16/bf16 bits (uint16); NaN stays NaN."""
    x = np.asarray(x, dtype=np.float32)
    if t == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).view(np.uint16)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def _scalar_const(v, t, n):
    if v in ("true", "false"):
        return np.full(n, v == "true")
    if t in ("f32", "f16", "bf16"):
        f = np.uint32(int(v, 16)).view(np.float32) if v.startswith("0x") and t == "f32" else np.float32(float(v))
        return np.full(n, f) if t == "f32" else np.full(n, _f32_to_bits(f, t))
    return np.full(n, int(v), dtype=_int_type(t))


def _const(op, n=LANES):
    t = op.types[0]
    m = re.search(r"value = (.+?) : (\S+)\}>", op.props) or re.search(r"value = (true|false)\}>", op.props)
    v = m.group(1)
    vec = _vector_shape(t)
    if vec:
        d = re.match(r"dense<([^>]+)>$", v)
        assert d and "[" not in d.group(1), f"only splat vector constants: {v}"
        scalar = _scalar_const(d.group(1), vec[1], n)
        return np.broadcast_to(scalar.reshape((n,) + (1,) * len(vec[0])), (n,) + vec[0]).copy()
    return _scalar_const(v, t, n)


CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater, 5: np.greater_equal}


def _unsigned(x):
    return x.astype({np.dtype(np.int32): np.uint32, np.dtype(np.int64): np.uint64,
                     np.dtype(np.int16): np.uint16}.get(x.dtype, x.dtype))


def _cmpf(pred, a, b):
    nan = np.isnan(a) | np.isnan(b)
    ordered = {1: a == b, 2: a > b, 3: a >= b, 4: a < b, 5: a <= b, 6: a != b}
    if pred in ordered:
        return ordered[pred] & ~nan
    if pred == 7:
        return ~nan
    if pred == 14:
        return nan
    unordered = {8: a == b, 9: a > b, 10: a >= b, 11: a < b, 12: a <= b, 13: a != b}
    return unordered[pred] | nan


def _bits_to_f32(bits, t):
    bits = bits.astype(np.uint16).astype(np.uint32)
    if t == "bf16":
        return (bits << 16).view(np.float32)
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


def _row_slices(arr, idx, mask, width, distinct=False):
    """The index of the active lanes' `width` elements arr[i0, ..., i_last : i_last + width] (vector.load and
    vector.store's lanes at once), [active lanes, width], where every one lies inside `arr` (and, with
    `distinct`, no two lanes' elements meet: a store's order would matter); None otherwise (the lane loop then
    takes them one by one, as it did every lane)."""
    at = [x[mask].astype(np.int64) for x in idx]
    if not at or len(at) != arr.ndim:
        return None
    for x, d in zip(at[:-1], arr.shape[:-1]):
        if x.size and (x.min() < 0 or x.max() >= d):
            return None
    last = at[-1]
    if last.size and (last.min() < 0 or last.max() + width > arr.shape[-1]):
        return None
    cols = last[:, None] + np.arange(width)
    at = tuple(x[:, None] for x in at[:-1]) + (cols,)
    if distinct and last.size > 1:
        flat = np.ravel_multi_index(np.broadcast_arrays(*at), arr.shape)
        if np.unique(flat).size != flat.size:
            return None
    return at


def _async_copy_shape(op):
    """nvgpu.device_async_copy's operand segment sizes and dstElements."""
    seg = [int(x) for x in re.search(r"operandSegmentSizes = array<i32: ([\d, ]+)>", op.props).group(1).split(",")]
    return seg, int(re.search(r"dstElements = (\d+)", op.props).group(1))


def _async_copy_lanes(dst, didx, src, sidx, count, elems):
    """The active lanes' cp.async copies at once: (the destination's index [lanes, elems], the rows to land
    there: each lane's `count` source elements, zeros past them), where every lane reads and writes inside the
    buffers and no two lanes' rows meet; None otherwise (the lane loop then copies them one by one, and says
    what is wrong)."""
    if not didx or not sidx or len(didx) != dst.ndim or len(sidx) != src.ndim or didx[0].size == 0:
        return None
    n = didx[0].size
    ks = np.full(n, elems, np.int64) if count is None else count.astype(np.int64)
    if ks.min() < 0 or ks.max() > elems:
        return None
    di = [x.astype(np.int64) for x in didx]
    if any(x.min() < 0 or x.max() >= d for x, d in zip(di[:-1], dst.shape[:-1])):
        return None
    if di[-1].min() < 0 or di[-1].max() + elems > dst.shape[-1]:
        return None
    ar = np.arange(elems)
    at = tuple(np.broadcast_to(x[:, None], (n, elems)) for x in di[:-1]) + (di[-1][:, None] + ar,)
    if n > 1 and np.unique(np.ravel_multi_index(at, dst.shape)).size != n * elems:
        return None
    reads = ks > 0
    si = [x.astype(np.int64) for x in sidx]
    if reads.any():
        if any(x[reads].min() < 0 or x[reads].max() >= d for x, d in zip(si[:-1], src.shape[:-1])):
            return None
        if si[-1][reads].min() < 0 or (si[-1] + ks)[reads].max() > src.shape[-1]:
            return None
    valid = ar[None, :] < ks[:, None]
    src_at = tuple(np.broadcast_to(np.where(reads, x, 0)[:, None], (n, elems)) for x in si[:-1]) + \
        (np.where(valid, si[-1][:, None] + ar, 0),)
    rows = np.where(valid, src[src_at], 0).astype(dst.dtype)
    return at, rows


class Memory:
    """Global buffers by argument and a fake address space for the 16-byte loads."""

    def __init__(self):
        self.buffers = []   # (base address, numpy array, element type name)

    def add(self, array, elt, misalign_bytes=0):
        base = (len(self.buffers) + 1) << 32 | (misalign_bytes & 15)
        self.buffers.append((base, array, elt))
        return len(self.buffers) - 1

    def at(self, address):
        """(array flattened, element index) of the global `address`."""
        for base, array, elt in self.buffers:
            if base <= address < base + array.nbytes:
                flat = array.reshape(-1)
                return flat, (address - base) // array.itemsize
        raise IndexError(hex(address))

    def load16_lanes(self, addresses):
        """load16 of each address of `addresses` at once, [len, 4] int32, where they all lie in one buffer with
        their 16 bytes; None otherwise (load16 then says which address is outside every buffer)."""
        if addresses.size == 0:
            return np.zeros((0, 4), np.int32)
        lo, hi = int(addresses.min()), int(addresses.max())
        for base, array, elt in self.buffers:
            if base <= lo and hi + 16 <= base + array.nbytes:
                raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
                at = (addresses.astype(np.int64) - base)[:, None] + np.arange(16)
                return np.ascontiguousarray(raw[at]).view(np.int32)
        return None

    def load16(self, address):
        for base, array, elt in self.buffers:
            if base <= address < base + array.nbytes:
                raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
                off = int(address - base)
                return np.frombuffer(raw[off:off + 16].tobytes(), dtype=np.int32)
        raise IndexError(hex(address))


#: The multiprocessors a kernel sees (%nsmid, nvvm.read.ptx.sreg.nsmid) unless run_kernel is given `sms`: 2, so
#: that a grid of 4 or more blocks takes the flash kernels' causal order with a second round to reverse
#: (FlashTile.h's FlashBlockOrder). Read at each run_kernel call (a test may set it).
SMS = 2

#: The shared-window address of gpu.dynamic_shared_memory (memref.extract_aligned_pointer_as_index): 16-byte
#: aligned, as a block's dynamic shared memory is at least, and no more, so that a kernel whose layout needs more
#: must align it itself.
DYNAMIC_SMEM_ADDRESS = 0x10410


@_gc_paused
def run_kernel(body, args, block_dim, grid, memory, smem_shape=None, workgroup=(), lockstep=False,
               dynamic_smem=0, async_copies="issue", warp_threads=False, workgroup_fill=0, sms=None):
    """Runs the kernel `body` (parse()) on `args` (numpy arrays for memrefs; the workgroup buffers are made here,
    fresh for each block: one f32 array of `smem_shape`, or one zeroed array per (shape, dtype) of `workgroup`)
    over `grid` blocks (gx, (gx, gy) or (gx, gy, gz)) of `block_dim` threads, one warp at a time, or with
    `lockstep` all the block's threads at once. `dynamic_smem`: the bytes of gpu.dynamic_shared_memory (zeroed
    for each block). `async_copies`: when a cp.async copy lands in shared memory, at its issue ("issue", the
    earliest it may) or at the wait that needs it ("wait", the latest: cp.async.wait.group N completes every
    group but the N last committed, copies of groups never waited for never land): a kernel that reads a
    buffer before waiting for its copies, or counts its groups wrong, reads stale data in "wait"; one that copies
    into a buffer still to be read reads the new data in "issue". `warp_threads`: each warp of a block runs in a
    thread of its own, the block's gpu.barrier a barrier of those threads (a kernel whose warps take loops or
    branches of their own between barriers: the 128-row flash kernel's lazy rescale, whose warps leave its hot loop
    at tiles of their own), instead of one lockstep group; the warps take turns, one running up to its next barrier
    (_WarpTurns). `workgroup_fill`: the value the `workgroup` buffers start with in each block (NaN: a kernel that
    reads what it did not write, or relies on zeros it did not store, shows it). `sms`: the value of %nsmid (None:
    SMS)."""
    block_args = body[0][0]
    sms = SMS if sms is None else sms
    dims = tuple(grid) + (1,) * (3 - len(grid)) if isinstance(grid, tuple) else (grid, 1, 1)
    for z in range(dims[2]):
        for y in range(dims[1]):
            for b in range(dims[0]):
                smem = [np.zeros(smem_shape, dtype=np.float32)] if smem_shape else []
                smem += [np.full(shape, workgroup_fill, dtype=dt) for shape, dt in workgroup]
                dyn = np.zeros(dynamic_smem, dtype=np.uint8)
                if warp_threads:
                    _run_warp_threads(body, args + smem, block_dim, memory, b, (y, z), dims, dyn, async_copies,
                                      sms)
                    continue
                lanes = block_dim if lockstep else LANES
                for w in range(block_dim // lanes):
                    env = dict(zip(block_args, _lanes_of(args + smem, lanes)))
                    warp = Warp(env, memory, b, w, lanes=lanes, block_yz=(y, z), grid=dims)
                    warp.dynamic_smem, warp.async_copies, warp.sms = dyn, async_copies, sms
                    with np.errstate(all="ignore"):     # (the hot ops' numpy: see Warp._constant)
                        warp.run_block(body[0][1], np.ones(lanes, bool))


def _lanes_of(values, lanes):
    """run_kernel's arguments as a group of `lanes` threads sees them: a scalar argument (a numpy integer: an
    address, such as flash-mma-tma's tensor map) in every lane; arrays (memrefs, workgroup buffers) as they are."""
    return [np.full(lanes, v) if isinstance(v, np.integer) else v for v in values]


def _run_warp_threads(body, values, block_dim, memory, block, block_yz, dims, dyn, async_copies, sms=SMS):
    """One block, a thread a warp (run_kernel's warp_threads): gpu.barrier waits for every warp; an error in one
    warp breaks the barrier for the others and is raised. The warps take turns (_WarpTurns): one runs, up to its
    next gpu.barrier or its return, while the others wait for their turn."""
    warps = block_dim // LANES
    turns = _WarpTurns(warps)
    errors = []

    def go(w):
        try:
            turns.wait_turn(w)
            env = dict(zip(body[0][0], _lanes_of(values, LANES)))
            warp = Warp(env, memory, block, w, lanes=LANES, block_yz=block_yz, grid=dims)
            warp.dynamic_smem, warp.async_copies, warp.barrier = dyn, async_copies, _WarpBarrier(turns, w)
            warp.sms = sms
            with np.errstate(all="ignore"):             # (numpy's error state is a thread's own)
                warp.run_block(body[0][1], np.ones(LANES, bool))
            # A warp that returns leaves the barrier to the others only once they are past their last one.
            turns.finish(w)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            turns.finish(w, broken=True)

    threads = [threading.Thread(target=go, args=(w,)) for w in range(warps)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        first = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)] or errors
        raise first[0]


class _WarpTurns:
    """gpu.barrier for a block's warp threads that run one at a time: warp 0 first, and each warp, at gpu.barrier
    or its return, hands over to the next one (in warp order) still short of the barrier; when every warp waits at
    the barrier, the barrier opens and they run again from the next warp on. So every warp reaches the barrier
    with all its earlier writes done and none goes past it before all have reached it, as with a threading.Barrier
    of free-running threads; but only one thread wants the GIL at a time (free-running, the warps' threads handed
    it to each other some 16,000 times a second: a lazy-rescale case's context switches went from 108k to 8.5k,
    its system time from 1.5 s to 0.6 s), and the warps' order between two barriers is the same on every run (warp
    order; the free-running threads' order was the scheduler's, switching every few ms). A warp that returns while
    the others wait at a barrier (a barrier not every warp reaches: a hang on a GPU) breaks it for them at once,
    where the free-running threads' barrier timed out after 600 s; an error in a warp breaks it too."""

    def __init__(self, warps):
        self.warps, self.current = warps, 0
        self.waiting, self.done, self.broken = set(), set(), None
        self.cond = threading.Condition()

    def wait_turn(self, w):
        with self.cond:
            while self.current != w and self.broken is None:
                self.cond.wait()
            if self.broken is not None:
                raise threading.BrokenBarrierError(self.broken)

    def barrier(self, w):
        with self.cond:
            self.waiting.add(w)
            self._hand_over(w)
        self.wait_turn(w)

    def finish(self, w, broken=False):
        with self.cond:
            self.done.add(w)
            if broken:
                self.broken = self.broken or "an error in another warp"
                self.cond.notify_all()
            elif self.broken is None:
                self._hand_over(w)

    def _hand_over(self, w):
        """The warp after `w` that may run: one short of the barrier, else (every live warp at it) all of them."""
        order = [(w + k) % self.warps for k in range(1, self.warps + 1)]
        ready = [v for v in order if v not in self.waiting and v not in self.done]
        if not ready and self.waiting:
            if self.done:
                self.broken = (f"warps {sorted(self.done)} returned while warps {sorted(self.waiting)} wait at "
                               "gpu.barrier")
            else:
                self.waiting.clear()          # every warp at the barrier: it opens
                ready = order
        self.current = ready[0] if ready else None
        self.cond.notify_all()


class _WarpBarrier:
    """Warp w's gpu.barrier (Warp.barrier) in _WarpTurns."""

    def __init__(self, turns, w):
        self.turns, self.w = turns, w

    def wait(self):
        self.turns.barrier(self.w)


def _uniform(v, mask):
    """The value of index vector `v` that every active lane holds (a subview's or view's offset)."""
    vals = np.unique(np.asarray(v)[mask]) if np.any(mask) else np.asarray(v)[:1]
    assert len(vals) == 1, f"a view offset that differs over the lanes: {vals}"
    return vals[0]


class Warp:
    def __init__(self, env, memory, block, warp, lanes=LANES, block_yz=(0, 0), grid=(1, 1, 1)):
        self.env, self.mem, self.block, self.warp = env, memory, block, warp
        self.n, self.block_yz, self.grid = lanes, block_yz, grid
        self.tid = np.arange(lanes, dtype=np.int64) + warp * lanes
        self.arrays = {id(a): (i, a) for i, (_, a, _) in enumerate(memory.buffers)}
        self.dynamic_smem, self.async_copies, self.barrier = np.zeros(0, np.uint8), "issue", None
        self.sms = SMS
        self.pending, self.groups = [], []   # cp.async copies not landed: this group's, committed groups

    def get(self, name):
        return self.env[name]

    def run_block(self, ops, mask, block_args=None, values=None):
        env = self.env
        if block_args:
            for n, v in zip(block_args, values):
                env[n] = v
        plan = ops.plan if isinstance(ops, _Block) else None
        if plan is None:
            plan = _plan(ops)
            if isinstance(ops, _Block):
                ops.plan = plan
        ndarray = np.ndarray
        for fast, run, op, args, results, last in plan:
            if fast is not None:        # reads its operands from env and writes its result there itself
                fast(self, env)
                continue
            out = run(self, op, [env[x] for x in args], mask)
            if last:
                return out
            if out is None:
                continue
            if out.__class__ is ndarray:            # one result (the common case, without the list)
                if results:
                    env[results[0]] = out
                continue
            if not isinstance(out, (list, tuple)):
                out = [out]
            for n, v in zip(results, out):
                env[n] = v
        return None

    def region(self, op, i, mask, values=()):
        args, ops = op.regions[i][0]
        return self.run_block(ops, mask, args, list(values))

    def step(self, op, mask):
        """Runs `op` (its operands from the environment): its results."""
        a = [self.env[x] for x in op.args]
        hot = _HOT.get(op.name)
        return hot(self, op, a, mask) if hot is not None else self._step(op, a, mask)

    def _step(self, op, a, mask):
        """The ops outside _HOT, by name: `a` their operands' values."""
        n = op.name
        if n == "gpu.thread_id":
            return self.tid.copy()
        if n == "gpu.block_id":
            d = re.search(r"dim (\w)", op.props).group(1)
            v = {"x": self.block, "y": self.block_yz[0], "z": self.block_yz[1]}[d]
            return np.full(self.n, v, dtype=np.int64)
        if n == "gpu.grid_dim":
            d = re.search(r"dim (\w)", op.props).group(1)
            return np.full(self.n, self.grid["xyz".index(d)], dtype=np.int64)
        if n == "nvvm.read.ptx.sreg.nsmid":
            return np.full(self.n, self.sms, dtype=np.int32)
        if n == "memref.dim":
            return np.full(self.n, a[0].shape[int(a[1][0])], dtype=np.int64)
        if n == "arith.ceildivui":
            ua, ud = _unsigned(a[0]), _unsigned(np.where(a[1] == 0, 1, a[1]))
            return ((ua + ud - 1) // ud).astype(a[0].dtype)
        if n == "arith.shli":
            return np.left_shift(a[0], a[1].astype(a[0].dtype))
        if n == "arith.shrsi":
            return np.right_shift(a[0], a[1].astype(a[0].dtype))
        if n == "arith.shrui":
            return np.right_shift(_unsigned(a[0]), _unsigned(a[1].astype(a[0].dtype))).astype(a[0].dtype)
        if n == "arith.minui":
            return np.minimum(_unsigned(a[0]), _unsigned(a[1])).astype(a[0].dtype)
        if n in ("arith.index_cast", "arith.extsi", "arith.trunci", "arith.extui", "arith.index_castui"):
            t = _int_type(op.types[0])
            if n == "arith.extui":
                src = a[0]
                if src.dtype == np.bool_:
                    return src.astype(t)
                return _unsigned(src).astype(t)
            with np.errstate(over="ignore"):
                return a[0].astype(t)
        if n == "arith.sitofp":
            return a[0].astype(np.float32)
        if n == "arith.bitcast":
            t = op.types[0]
            if t == "f32":
                return a[0].astype(np.int32).view(np.float32)
            if t == "i32":
                return a[0].astype(np.float32).view(np.int32)
            if t in ("bf16", "f16"):
                return a[0]            # 16-bit floats are held as their bits
            raise NotImplementedError(f"bitcast to {t}")
        if n == "arith.extf":
            src_t = re.search(r"\((\w+)\) ->", op.props).group(1)
            return _bits_to_f32(a[0], src_t) if src_t in ("bf16", "f16") else a[0].astype(np.float32)
        if n == "arith.negf":
            return -a[0]
        if n == "math.log":
            with np.errstate(all="ignore"):
                return np.log(a[0]).astype(np.float32)
        if n in ("math.log1p", "math.sqrt", "math.absf", "math.tanh"):
            f = {"math.log1p": np.log1p, "math.sqrt": np.sqrt, "math.absf": np.abs, "math.tanh": np.tanh}[n]
            with np.errstate(all="ignore"):
                return f(a[0]).astype(np.float32)
        if n == "memref.extract_aligned_pointer_as_index":
            if a[0] is self.dynamic_smem:
                return np.full(self.n, DYNAMIC_SMEM_ADDRESS, dtype=np.int64)
            i, arr = self.arrays[id(a[0])]
            return np.full(self.n, self.mem.buffers[i][0], dtype=np.int64)
        if n == "llvm.inline_asm":
            assert "ld.global.nc.v4.b32" in op.props
            words = np.zeros((4, self.n), dtype=np.int32)
            lanes = np.flatnonzero(mask)
            loaded = self.mem.load16_lanes(a[0][lanes])
            if loaded is not None:
                words[:, lanes] = loaded.T
                return [tuple(words)]
            for l in lanes:
                words[:, l] = self.mem.load16(int(a[0][l]))
            return [tuple(words)]
        if n == "memref.atomic_rmw":
            # addf (kind 0) only: the active lanes' adds in lane order, each rounded to f32 (one order of the
            # many a GPU's atomics may land in: the kernels' tests allow f32 rounding).
            assert "kind = 0 " in op.props, op.props
            arr = a[1]
            old = np.zeros(self.n, dtype=arr.dtype)
            for l in range(self.n):
                if mask[l]:
                    at = tuple(int(i[l]) for i in a[2:])
                    old[l] = arr[at]
                    arr[at] = arr.dtype.type(arr[at] + a[0][l])
            return old
        if n == "nvvm.match.sync":
            assert "any" in op.props, op.props
            out = np.zeros(self.n, dtype=np.int32)
            for w0 in range(0, self.n, LANES):
                v, m = a[1][w0:w0 + LANES], mask[w0:w0 + LANES] & ((int(a[0][w0]) & 0xFFFFFFFF) != 0)
                for l in range(LANES):
                    bits = sum(1 << j for j in range(LANES) if m[j] and v[j] == v[l])
                    out[w0 + l] = np.uint32(bits).view(np.int32)
            return out
        if n == "math.ctpop":
            u = _unsigned(a[0]).astype(np.uint64)
            return np.array([bin(int(x)).count("1") for x in u], dtype=a[0].dtype)
        if n == "math.cttz":
            bits = 8 * a[0].dtype.itemsize
            u = _unsigned(a[0]).astype(np.uint64)
            return np.array([(int(x) & -int(x)).bit_length() - 1 if x else bits for x in u], dtype=a[0].dtype)
        if n == "llvm.inttoptr":
            return a[0].astype(np.int64)
        if n == "llvm.getelementptr":
            idx = int(re.search(r"rawConstantIndices = array<i32: (-?\d+)>", op.props).group(1))
            elt = re.search(r"elem_type = (\w+)", op.props).group(1)
            return a[0] + idx * {"i64": 8, "i32": 4}[elt]
        if n == "llvm.cmpxchg":
            old = np.zeros(self.n, dtype=np.int64)
            ok = np.zeros(self.n, dtype=bool)
            for l in range(self.n):
                if mask[l]:
                    flat, i = self.mem.at(int(a[0][l]))
                    old[l] = flat[i]
                    ok[l] = flat[i] == a[1][l]
                    if ok[l]:
                        flat[i] = a[2][l]
            return [(old, ok)]
        if n == "llvm.store":
            for l in range(self.n):
                if mask[l]:
                    flat, i = self.mem.at(int(a[1][l]))
                    flat[i] = a[0][l]
            return None
        if n == "gpu.shuffle":
            assert "xor" in op.props, op.props
            src = np.arange(self.n) ^ a[1]
            return [a[0][src], np.ones(self.n, bool)]
        if n == "nvvm.vote.sync":
            assert "any" in op.props
            votes = (a[1] & mask).reshape(-1, LANES).any(axis=1)
            return np.repeat(votes, LANES)
        if n == "nvvm.redux.sync":
            assert self.n == LANES, "redux in lockstep blocks"
            kind = "max" if "max" in op.props else "min"
            if np.issubdtype(a[0].dtype, np.integer) and ((a[1].astype(np.int64) & 0xFFFFFFFF) == 0xFFFFFFFF).all():
                # Every lane's mask names the whole warp (the common case): one max or min for all.
                return np.full(LANES, a[0].max() if kind == "max" else a[0].min(), dtype=a[0].dtype)
            members = ((a[1].astype(np.int64)[:, None] & 0xFFFFFFFF) >> np.arange(LANES)) & 1 == 1
            if np.issubdtype(a[0].dtype, np.integer) and members.any(axis=1).all():
                # Every lane's max or min over the lanes its mask names, as the loop below (which also takes
                # floats, and raises for an empty mask) computes it.
                info = np.iinfo(a[0].dtype)
                fill = info.min if kind == "max" else info.max
                vals = np.where(members, a[0][None, :], fill)
                return (vals.max(axis=1) if kind == "max" else vals.min(axis=1)).astype(a[0].dtype)
            out = np.empty(LANES, dtype=a[0].dtype)
            for l in range(LANES):
                m = int(a[1][l]) & 0xFFFFFFFF
                lanes = [j for j in range(LANES) if m >> j & 1]
                out[l] = (max if kind == "max" else min)(a[0][j] for j in lanes)
            return out
        if n == "nvvm.bar.warp.sync":
            return None
        if n in _SCF:
            return self._scf(op, a, mask)
        out = self.step_mma(op, n, a, mask)
        if out is not NotImplemented:
            return out
        raise NotImplementedError(n)

    def _memref_load(self, op, a, mask):
        """memref.load: each active lane's element (inactive lanes read index 0)."""
        arr = a[0]
        idx = a[1:] if mask.all() else [np.where(mask, i, 0) for i in a[1:]]
        return arr[tuple(idx)] if arr.ndim else np.full(self.n, arr)

    def _memref_store(self, op, a, mask):
        """memref.store: each active lane's element."""
        arr = a[1]
        full = mask.all()
        if len(a) - 2 == arr.ndim > 0 and (full or mask.any()):
            # The active lanes' stores at once where they hit distinct elements in bounds (the lane loop
            # below, the last lane's value kept, where two lanes store to one element or one is out of bounds).
            at = tuple(a[2:]) if full else tuple(i[mask] for i in a[2:])
            if all(x.min() >= 0 and x.max() < d for x, d in zip(at, arr.shape)):
                flat = at[0] if len(at) == 1 else np.ravel_multi_index(at, arr.shape)
                if flat.size == 1 or len(set(flat.tolist())) == flat.size:
                    arr[at] = a[0] if full else a[0][mask]
                    return None
        for l in range(self.n):
            if mask[l]:
                arr[tuple(int(i[l]) for i in a[2:])] = a[0][l]
        return None

    def _scf(self, op, a, mask):
        """The control flow (scf, gpu.return): regions under lane masks."""
        n = op.name
        if n == "scf.if":
            cond = a[0]
            take = cond & mask
            skip = ~cond & mask
            has_else = len(op.regions) > 1 and op.regions[1] and op.regions[1][0][1]
            if not op.results and not take.any() and not has_else:
                return None                     # no lane takes it (a block-uniform branch not taken)
            r1 = self.region(op, 0, take) if take.any() or not has_else else None
            if not op.results:
                if has_else and skip.any():
                    self.region(op, 1, skip)
                return None
            if not skip.any():
                return r1
            r2 = self.region(op, 1, skip)
            if not take.any():
                return r2
            return [np.where(cond, x, y) for x, y in zip(r1, r2)]
        if n == "scf.for" and not (np.all(a[0] == a[0][0]) and np.all(a[1] == a[1][0])) and len(a) == 3:
            # Lanes with their own bounds (a block striding over a tile), no carried values: each lane's
            # trips, the others masked.
            assert np.all(a[2] == a[2][0]), "scf.for step must be uniform"
            i = a[0].copy()
            while True:
                live = mask & (i < a[1])
                if not live.any():
                    return []
                self.region(op, 0, live, [i.copy()])
                i = i + a[2]
        if n == "scf.for" and not (np.all(a[0] == a[0][0]) and np.all(a[1] == a[1][0])):
            # Lanes with their own bounds and carried values (a lane's picks j = lane, lane + W, ... < k): each
            # lane's trips, its values kept once it is done (the GPU's lane idles).
            assert np.all(a[2] == a[2][0]), "scf.for step must be uniform"
            i, vals = a[0].copy(), list(a[3:])
            while True:
                live = mask & (i < a[1])
                if not live.any():
                    return vals
                out = self.region(op, 0, live, [i.copy()] + vals)
                vals = [np.where(live.reshape(live.shape + (1,) * (o.ndim - 1)), o, v) for o, v in zip(out, vals)]
                i = i + a[2]
        if n == "scf.for":
            lb, ub, st = int(a[0][0]), int(a[1][0]), int(a[2][0])
            assert np.all(a[0] == lb) and np.all(a[1] == ub), "scf.for bounds must be warp-uniform"
            vals = a[3:]
            for i in range(lb, ub, st):
                vals = self.region(op, 0, mask, [np.full(self.n, i, dtype=np.int64)] + list(vals)) or []
            return list(vals)
        if n == "scf.while":
            vals = a
            while True:
                cond, passed = self.region(op, 0, mask, vals)
                live = cond[mask]
                assert live.all() or not live.any(), "scf.while condition must be warp-uniform"
                if not live.any():
                    return passed
                vals = self.region(op, 1, mask, passed)
        if n == "scf.yield":
            return a
        if n == "scf.condition":
            return (a[0], a[1:])
        if n == "gpu.return":
            return []
        raise NotImplementedError(n)

    # The tensor-core kernel's ops (see the module's docstring).
    def step_mma(self, op, n, a, mask):
        if n == "gpu.barrier":
            if self.barrier is not None:
                self.barrier.wait()
            return None
        if n == "nvvm.cp.async.commit.group":
            self.groups.append(self.pending)
            self.pending = []
            return None
        if n == "nvvm.cp.async.wait.group":
            keep = int(re.search(r"n = (\d+)", op.props).group(1))
            while len(self.groups) > keep:
                for land in self.groups.pop(0):
                    land()
            return None
        if n == "llvm.mlir.poison":
            vec = _vector_shape(op.types[0])
            if vec:
                dt = np.uint16 if vec[1] in ("f16", "bf16") else (np.float32 if vec[1] == "f32" else _int_type(vec[1]))
                return np.zeros((self.n,) + vec[0], dtype=dt)
            return np.zeros(self.n, dtype=np.float32 if op.types[0] == "f32" else _int_type(op.types[0]))
        if n == "gpu.dynamic_shared_memory":
            return self.dynamic_smem
        if n == "memref.view":
            shift = int(_uniform(a[1], mask))
            m = re.match(r"memref<((?:\d+x)+)(\w+)", op.types[0])
            shape = tuple(int(d) for d in m.group(1).rstrip("x").split("x"))
            dt = {"f16": np.uint16, "bf16": np.uint16, "f32": np.float32}[m.group(2)]
            size = int(np.prod(shape)) * np.dtype(dt).itemsize
            assert shift % 16 == 0 and shift + size <= a[0].size, "a view outside the dynamic shared memory"
            return a[0][shift:shift + size].view(dt).reshape(shape)
        if n == "memref.collapse_shape":
            groups = re.search(r"reassociation = (\[\[.*?\]\])", op.props).group(1)
            groups = [[int(x) for x in g.split(",")] for g in re.findall(r"\[([\d, ]+)\]", groups)]
            shape = tuple(int(np.prod([a[0].shape[d] for d in g])) for g in groups)
            view = a[0].reshape(shape)
            assert np.shares_memory(view, a[0]), "collapse_shape of a non-contiguous buffer"
            return view
        if n == "memref.subview":
            seg = [int(x) for x in re.search(r"operandSegmentSizes = array<i32: ([\d, ]+)>", op.props)
                   .group(1).split(",")]
            assert seg[2] == 0 and seg[3] == 0, "only static sizes and strides"
            static = [int(x) for x in re.search(r"static_offsets = array<i64: ([-\d, ]+)>", op.props)
                      .group(1).split(",")]
            sizes = [int(x) for x in re.search(r"static_sizes = array<i64: ([-\d, ]+)>", op.props)
                     .group(1).split(",")]
            strides = [int(x) for x in re.search(r"static_strides = array<i64: ([-\d, ]+)>", op.props)
                       .group(1).split(",")]
            assert all(st == 1 for st in strides), "only unit strides"
            dyn = iter(a[1:1 + seg[1]])
            offs = [int(_uniform(next(dyn), mask)) if o == -2 ** 63 else o for o in static]
            assert all(o + sz <= d for o, sz, d in zip(offs, sizes, a[0].shape)), "a subview out of bounds"
            return a[0][tuple(slice(o, o + sz) for o, sz in zip(offs, sizes))]
        if n == "vector.load":
            shape, _t = _vector_shape(op.types[0])
            arr, idx = a[0], a[1:]
            width = shape[-1]
            out = np.zeros((self.n, width), dtype=arr.dtype)
            at = _row_slices(arr, idx, mask, width)
            if at is not None:
                out[mask] = arr[at]
                return out
            for l in range(self.n):
                if mask[l]:
                    i = [int(x[l]) for x in idx]
                    out[l] = arr[tuple(i[:-1])][i[-1]:i[-1] + width]
            return out
        if n == "vector.store":
            val, arr, idx = a[0], a[1], a[2:]
            at = _row_slices(arr, idx, mask, val.shape[-1], distinct=True)
            if at is not None:
                arr[at] = val[mask]
                return None
            for l in range(self.n):
                if mask[l]:
                    i = [int(x[l]) for x in idx]
                    arr[tuple(i[:-1])][i[-1]:i[-1] + val.shape[-1]] = val[l]
            return None
        if n == "nvgpu.device_async_copy":
            seg, elems = _static(op, "cp.async", _async_copy_shape)
            dst, didx = a[0], a[1:1 + seg[1]]
            src = a[1 + seg[1]]
            sidx = a[2 + seg[1]:2 + seg[1] + seg[3]]
            count = a[2 + seg[1] + seg[3]] if seg[4] else None
            lanes = np.flatnonzero(mask)
            copy = _async_copy_lanes(dst, [x[lanes] for x in didx], src, [x[lanes] for x in sidx],
                                     None if count is None else count[lanes], elems)
            if copy is not None:
                # Every active lane's copy at once, landing together (the lanes' rows distinct).
                def land_all(at=copy[0], rows=copy[1]):
                    dst[at] = rows
                if self.async_copies == "wait":
                    self.pending.append(land_all)
                else:
                    land_all()
                return np.zeros(self.n, dtype=np.int64)
            for l in range(self.n):
                if not mask[l]:
                    continue
                di = [int(x[l]) for x in didx]
                si = [int(x[l]) for x in sidx]
                k = elems if count is None else int(count[l])
                row = np.zeros(elems, dtype=dst.dtype)
                if k:
                    row[:k] = src[tuple(si[:-1])][si[-1]:si[-1] + k]
                target = dst[tuple(di[:-1])]
                assert di[-1] + elems <= target.shape[-1], "cp.async past its row"

                def land(target=target, at=di[-1], row=row):
                    target[at:at + elems] = row
                if self.async_copies == "wait":
                    self.pending.append(land)
                else:
                    land()
            return np.zeros(self.n, dtype=np.int64)
        return NotImplemented

    # The hot ops: those the kernels' loops run hundreds of thousands of times, dispatched by name (_HOT, _BOUND)
    # before _step's chain of tests, what they read off their text computed once per op (_static, or bound into
    # the handler by _BOUND). Same numpy work as _step's other ops; only the dispatch and the regexes are saved.
    # They run under errstate(all="ignore") (run_kernel sets it once per warp): a kernel's inf and NaN are
    # values, not warnings. Values are never written in place (vector.insert copies), so a handler may return
    # a view of its operand, or a constant's array itself.
    def _constant(self, op, a, mask):
        return _static(op, ("value", self.n), lambda op: _const(op, self.n))

    def _int_binary(self, op, a, mask):
        x = a[0]
        return _INT_BINARY[op.name](x, a[1]).astype(x.dtype, copy=False)

    def _div_rem(self, op, a, mask):
        d = np.where(a[1] == 0, 1, a[1])
        ua, ud = _unsigned(a[0]), _unsigned(d)
        r = ua // ud if op.name == "arith.divui" else ua % ud
        return r.astype(a[0].dtype)

    def _bitwise(self, op, a, mask):
        return _BITWISE[op.name](a[0], a[1])

    def _cmpi(self, op, a, mask):
        pred = _static(op, "predicate", lambda op: int(_prop(op, "predicate").split(":")[0]))
        if pred >= 6:
            x, y = _unsigned(a[0]), _unsigned(a[1])
            return {6: x < y, 7: x <= y, 8: x > y, 9: x >= y}[pred]
        return CMPI[pred](a[0], a[1])

    def _cmpf_op(self, op, a, mask):
        return _cmpf(_static(op, "predicate", lambda op: int(_prop(op, "predicate").split(":")[0])), a[0], a[1])

    def _select(self, op, a, mask):
        c, x = a[0], a[1]
        if c.ndim != x.ndim:
            c = c.reshape(c.shape + (1,) * (x.ndim - c.ndim))
        return np.where(c, x, a[2])

    def _float_binary(self, op, a, mask):
        return _FLOAT_BINARY[op.name](a[0], a[1]).astype(np.float32, copy=False)

    def _max_min_f(self, op, a, mask):
        f = np.maximum if op.name == "arith.maximumf" else np.minimum   # NaN-propagating, as arith's
        return f(a[0], a[1]).astype(np.float32, copy=False)

    def _max_min_si(self, op, a, mask):
        return (np.maximum if op.name == "arith.maxsi" else np.minimum)(a[0], a[1])

    def _exp(self, op, a, mask):
        return np.exp(a[0]).astype(np.float32, copy=False)

    def _fma(self, op, a, mask):
        return (a[0] * a[1] + a[2]).astype(np.float32, copy=False)

    def _call_intrinsic(self, op, a, mask):
        name = _static(op, "intrin", lambda op: re.search(r'intrin = "([^"]+)"', op.props).group(1))
        if "ex2.approx" in name:
            return np.exp2(a[0]).astype(np.float32, copy=False)
        if "rcp.approx" in name:
            return (np.float32(1.0) / a[0]).astype(np.float32, copy=False)
        raise NotImplementedError(name)

    def _extractvalue(self, op, a, mask):
        return a[0][_static(op, "position",
                            lambda op: int(re.search(r"position = array<i64: (\d+)>", op.props).group(1)))]

    def _from_elements(self, op, a, mask):
        shape, _t = _vector_shape(op.types[0])
        return _columns(a).reshape((self.n,) + shape)

    def _vector_extract(self, op, a, mask):
        return a[0][_static(op, "position", _lanes_position)]

    def _vector_insert(self, op, a, mask):
        out = a[1].copy()
        out[_static(op, "position", _lanes_position)] = a[0]
        return out

    def _vector_bitcast(self, op, a, mask):
        dshape = _static(op, "shape", _bitcast_shape)
        # bf16/f16 pairs (lanes, ..., 2m) into i32 (lanes, ..., m): the low half the even element (little-endian,
        # as the bits of a pair are in a register).
        bits = np.ascontiguousarray(a[0], dtype=np.uint16)
        return bits.view(np.int32).reshape((self.n,) + dshape)

    def _truncf(self, op, a, mask):
        return _f32_to_bits(a[0], _static(op, "type", _truncf_type))

    def _ldmatrix(self, op, a, mask):
        tiles, trans = _static(op, "ldmatrix", lambda op: (int(re.search(r"numTiles = (\d+)", op.props).group(1)),
                                                            "transpose = true" in op.props))
        smem, rows, cols = a[0], a[1], a[2]
        warps = self.n // LANES
        if not mask.all():
            raise AssertionError("ldmatrix with inactive lanes")
        # Lanes 8i..8i+7 of a warp give tile i's row addresses: [warps, tiles, 8 rows, 8 columns].
        r = rows.reshape(warps, LANES)[:, :8 * tiles].reshape(warps, tiles, 8, 1)
        c = cols.reshape(warps, LANES)[:, :8 * tiles].reshape(warps, tiles, 8, 1) + _EIGHT
        if (c[..., 0] < 0).any() or (c[..., -1] >= smem.shape[1]).any():
            raise IndexError("ldmatrix: a row past its buffer's columns")
        m = smem[r, c]
        if trans:
            m = m.swapaxes(2, 3)
        # Lane l takes m[l // 4, 2 (l % 4) : 2 (l % 4) + 2]: the 8 x 8 tile's pairs in row-major order.
        return m.reshape(warps, tiles, LANES, 2).swapaxes(1, 2).reshape(self.n, tiles, 2).astype(np.uint16,
                                                                                                  copy=False)

    def _mma(self, op, a, mask):
        """m16n8k16 row.col on each warp: A [16 x 16], B [16 x 8] (k x n), C/D [16 x 8] f32; the lanes' fragments
        placed and read by _MMA_A, _MMA_B and _MMA_C (the PTX fragment layouts)."""
        n = op.name
        if n == "nvgpu.mma.sync":
            t = "f16"
            af, bf = a[0].reshape(self.n, 8), a[1].reshape(self.n, 4)
            c = a[2].reshape(self.n, 4)
        else:
            t = _static(op, "type", lambda op: re.search(r"multiplicandAPtxType = #nvvm.mma_type<(\w+)>",
                                                         op.props).group(1))
            if t == "tf32":
                return self._mma_tf32(a)
            assert t in ("bf16", "f16"), t

            def unpack(words):
                # Each lane's i32 registers as their bf16/f16 halves, low half first: [lanes, 2 x registers].
                return np.ascontiguousarray(_columns(words), dtype=np.int32).view(np.uint16)
            af, bf = unpack(a[0:4]), unpack(a[4:6])
            c = _columns(a[6:10])
        d = self._mma_tiles(_bits_to_f32(af, t), _bits_to_f32(bf, t), c, 16, _MMA_A_FLAT, _MMA_B_FLAT)
        if n == "nvgpu.mma.sync":
            return d.reshape(self.n, 2, 2)
        return [tuple(d[:, i] for i in range(4))]

    def _mma_tiles(self, av, bv, c, k, a_at, b_at):
        """Each warp's D = A B + C, A [16 x k], B [k x 8], C/D [16 x 8] f32, from the lanes' fragment values at the
        layouts' positions (a_at, b_at: _flat() of them): products exact, sums in float64 rounded to f32."""
        warps = self.n // LANES
        A = np.empty((warps, 16 * k))
        B = np.empty((warps, k * 8))
        C = np.empty((warps, 16 * 8))
        A[:, a_at] = av.reshape(warps, -1)
        B[:, b_at] = bv.reshape(warps, -1)
        C[:, _MMA_C_FLAT] = c.reshape(warps, -1)
        D = (A.reshape(warps, 16, k) @ B.reshape(warps, k, 8) + C.reshape(warps, 16, 8)).astype(np.float32)
        return D.reshape(warps, 16 * 8)[:, _MMA_C_FLAT].reshape(self.n, 4)

    def _mma_tf32(self, a):
        """m16n8k8 row.col with tf32 operands (flash-mma-tf32's 3xTF32): A [16 x 8] in 4 registers, B [8 x 8] in 2,
        C/D [16 x 8] f32 (_MMA_TF32_A, _MMA_TF32_B, _MMA_C). An operand register's f32 bits with the low 13 mantissa
        bits dropped (the tensor cores read tf32's top 19 bits); products exact, sums in float64 rounded to f32."""
        def operand(words):
            w = _columns(words).astype(np.int64).astype(np.uint32) & np.uint32(0xFFFFE000)
            return w.view(np.float32).astype(np.float64)
        d = self._mma_tiles(operand(a[0:4]), operand(a[4:6]), _columns(a[6:10]), 8, _MMA_TF32_A_FLAT,
                            _MMA_TF32_B_FLAT)
        return [tuple(d[:, i] for i in range(4))]


def _columns(arrays):
    """np.stack(arrays, axis=1) of the lanes' values (1-D arrays of one shape) as [lanes, len(arrays)], without
    np.stack's checks: half the time of vector.from_elements and mma.sync's operand packing."""
    if arrays[0].ndim == 1:
        try:
            x = np.array(arrays)
        except ValueError:          # lanes of other counts: np.stack says so
            return np.stack(arrays, axis=1)
        if x.ndim == 2:
            return x.T
    return np.stack(arrays, axis=1)


def _mma_layout():
    """(rows, cols) index arrays [32 lanes, values] of m16n8k16's fragments: lane l (g = l / 4, q = l % 4) holds
    A[g, 2q:2q+2], A[g+8, 2q:2q+2], A[g, 2q+8:2q+10], A[g+8, 2q+8:2q+10]; B[2q:2q+2, g], B[2q+8:2q+10, g];
    C and D [g, 2q:2q+2], [g+8, 2q:2q+2]."""
    g, q = np.arange(LANES)[:, None] // 4, np.arange(LANES)[:, None] % 4
    j2 = np.arange(2)[None, :]
    a = (np.concatenate([g + 0 * j2, g + 8 + 0 * j2, g + 0 * j2, g + 8 + 0 * j2], axis=1),
         np.concatenate([2 * q + j2, 2 * q + j2, 2 * q + 8 + j2, 2 * q + 8 + j2], axis=1))
    b = (np.concatenate([2 * q + j2, 2 * q + 8 + j2], axis=1), np.concatenate([g + 0 * j2, g + 0 * j2], axis=1))
    c = (np.concatenate([g + 0 * j2, g + 8 + 0 * j2], axis=1), np.concatenate([2 * q + j2, 2 * q + j2], axis=1))
    return a, b, c


_MMA_A, _MMA_B, _MMA_C = _mma_layout()


def _flat(at, shape):
    """A layout's (rows, cols) index arrays [32 lanes, values] as flat indices into the row-major `shape`, in the
    lanes' order (lane-major): where each of a warp's fragment values sits in its matrix."""
    return np.ravel_multi_index(at, shape).ravel()


_MMA_A_FLAT, _MMA_B_FLAT, _MMA_C_FLAT = _flat(_MMA_A, (16, 16)), _flat(_MMA_B, (16, 8)), _flat(_MMA_C, (16, 8))
_EIGHT = np.arange(8)


def _mma_tf32_layout():
    """(rows, cols) index arrays [32 lanes, values] of m16n8k8 tf32's A and B fragments: lane l (g = l / 4, q = l % 4)
    holds A[g, q], A[g+8, q], A[g, q+4], A[g+8, q+4] and B[q, g], B[q+4, g] (C as m16n8k16's)."""
    g, q = np.arange(LANES)[:, None] // 4, np.arange(LANES)[:, None] % 4
    a = (np.concatenate([g, g + 8, g, g + 8], axis=1), np.concatenate([q, q, q + 4, q + 4], axis=1))
    b = (np.concatenate([q, q + 4], axis=1), np.concatenate([g, g], axis=1))
    return a, b


_MMA_TF32_A, _MMA_TF32_B = _mma_tf32_layout()
_MMA_TF32_A_FLAT, _MMA_TF32_B_FLAT = _flat(_MMA_TF32_A, (16, 8)), _flat(_MMA_TF32_B, (8, 8))


def _lanes_position(op):
    """vector.extract's or vector.insert's static position, as an index behind the lanes' axis."""
    return (slice(None),) + tuple(int(x) for x in re.search(r"static_position = array<i64: ([\d, ]+)>", op.props)
                                  .group(1).split(","))


def _bitcast_shape(op):
    """The result shape of a vector.bitcast of bf16/f16 pairs to i32 (the only one the kernels use)."""
    src = re.search(r"\((vector<[^>]+>)\) -> ", op.props).group(1)
    (sshape, st), (dshape, dt) = _vector_shape(src), _vector_shape(op.types[0])
    assert st in ("bf16", "f16") and dt == "i32" and sshape[-1] == 2 * dshape[-1], (src, op.types[0])
    return dshape


def _truncf_type(op):
    t = op.types[0]
    vec = _vector_shape(t)
    et = vec[1] if vec else t
    assert et in ("bf16", "f16"), t
    return et


_INT_BINARY = {"arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply}
_BITWISE = {"arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor}
_FLOAT_BINARY = {"arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply, "arith.divf": np.divide}
_HOT = {"arith.constant": Warp._constant, "arith.divui": Warp._div_rem, "arith.remui": Warp._div_rem,
        "arith.cmpi": Warp._cmpi, "arith.cmpf": Warp._cmpf_op, "arith.select": Warp._select,
        "arith.maximumf": Warp._max_min_f, "arith.minimumf": Warp._max_min_f, "math.fma": Warp._fma,
        "arith.maxsi": Warp._max_min_si, "arith.minsi": Warp._max_min_si, "math.exp": Warp._exp,
        "llvm.call_intrinsic": Warp._call_intrinsic, "llvm.extractvalue": Warp._extractvalue,
        "vector.from_elements": Warp._from_elements, "vector.extract": Warp._vector_extract,
        "vector.insert": Warp._vector_insert, "vector.bitcast": Warp._vector_bitcast, "arith.truncf": Warp._truncf,
        "nvgpu.ldmatrix": Warp._ldmatrix, "nvgpu.mma.sync": Warp._mma, "nvvm.mma.sync": Warp._mma,
        "memref.load": Warp._memref_load, "memref.store": Warp._memref_store}
_HOT.update({name: Warp._int_binary for name in _INT_BINARY})
_HOT.update({name: Warp._bitwise for name in _BITWISE})
_HOT.update({name: Warp._float_binary for name in _FLOAT_BINARY})
_SCF = frozenset(("scf.if", "scf.for", "scf.while", "scf.yield", "scf.condition", "gpu.return"))
#: The ops step_mma takes (its chain of names, not _step's, which ends in it): run by it directly.
_STEP_MMA = frozenset((
    "gpu.barrier", "gpu.dynamic_shared_memory", "llvm.mlir.poison", "memref.collapse_shape", "memref.subview",
    "memref.view", "nvgpu.device_async_copy", "nvvm.cp.async.commit.group", "nvvm.cp.async.wait.group",
    "vector.load", "vector.store"))


def _step_mma(warp, op, a, mask):
    out = warp.step_mma(op, op.name, a, mask)
    if out is NotImplemented:
        raise NotImplementedError(op.name)
    return out


def _bind_constant(op):
    values = {}           # by the group's lanes (a warp, or a lockstep block)

    def run(warp, op, a, mask):
        v = values.get(warp.n)
        if v is None:
            v = values[warp.n] = _const(op, warp.n)
        return v
    return run


def _bind_cmpi(op):
    pred = int(_prop(op, "predicate").split(":")[0])
    if pred >= 6:
        return Warp._cmpi
    f = CMPI[pred]
    return lambda warp, op, a, mask: f(a[0], a[1])


def _bind_ufunc(table, cast=None):
    """A binary op of `table` (name -> ufunc), its result cast to `cast` (a dtype), or to its first operand's dtype
    (cast "first"), or left as the ufunc gives it (None)."""
    def bind(op):
        f = table[op.name]
        if cast is None:
            return lambda warp, op, a, mask: f(a[0], a[1])
        if cast == "first":
            def run(warp, op, a, mask):
                x = a[0]
                return f(x, a[1]).astype(x.dtype, copy=False)
            return run
        return lambda warp, op, a, mask: f(a[0], a[1]).astype(cast, copy=False)
    return bind


def _bind_position(op, position):
    at = position(op)
    return lambda warp, op, a, mask: a[0][at]


#: Ops whose handler is made per op at its block's first run, what it reads off the op's text bound into it.
_BOUND = {"arith.constant": _bind_constant, "arith.cmpi": _bind_cmpi,
          "arith.maxsi": _bind_ufunc({"arith.maxsi": np.maximum}),
          "arith.minsi": _bind_ufunc({"arith.minsi": np.minimum}),
          "vector.extract": lambda op: _bind_position(op, _lanes_position),
          "llvm.extractvalue": lambda op: _bind_position(
              op, lambda op: int(re.search(r"position = array<i64: (\d+)>", op.props).group(1)))}
_BOUND.update({name: _bind_ufunc(_INT_BINARY, "first") for name in _INT_BINARY})
_BOUND.update({name: _bind_ufunc(_BITWISE) for name in _BITWISE})
_BOUND.update({name: _bind_ufunc(_FLOAT_BINARY, np.float32) for name in _FLOAT_BINARY})


# The most frequent ops (the route kernels' selection network, the index arithmetic) once more, as handlers that
# read their operands from the environment and write their one result into it themselves: run_block's loop then
# makes no operand list and looks at no returned value for them. Each computes what its _BOUND handler computes.
def _fast_constant(op, args, r):
    values = {}

    def fast(warp, env):
        v = values.get(warp.n)
        if v is None:
            v = values[warp.n] = _const(op, warp.n)
        env[r] = v
    return fast


def _fast_ufunc(table, cast=None):
    def make(op, args, r):
        if len(args) != 2:
            return None
        f, (x, y) = table[op.name], args
        if cast is None:
            def fast(warp, env):
                env[r] = f(env[x], env[y])
        elif cast == "first":
            def fast(warp, env):
                v = env[x]
                env[r] = f(v, env[y]).astype(v.dtype, copy=False)
        else:
            def fast(warp, env):
                env[r] = f(env[x], env[y]).astype(cast, copy=False)
        return fast
    return make


def _fast_cmpi(op, args, r):
    pred = int(_prop(op, "predicate").split(":")[0])
    return _fast_ufunc({op.name: CMPI[pred]})(op, args, r) if pred < 6 else None


def _fast_select(op, args, r):
    if len(args) != 3:
        return None
    c, x, y = args

    def fast(warp, env):
        cv, xv = env[c], env[x]
        if cv.ndim != xv.ndim:
            cv = cv.reshape(cv.shape + (1,) * (xv.ndim - cv.ndim))
        env[r] = np.where(cv, xv, env[y])
    return fast


def _fast_position(position):
    def make(op, args, r):
        if len(args) != 1:
            return None
        at, (x,) = position(op), args

        def fast(warp, env):
            env[r] = env[x][at]
        return fast
    return make


_FAST = {"arith.constant": _fast_constant, "arith.cmpi": _fast_cmpi, "arith.select": _fast_select,
         "arith.maxsi": _fast_ufunc({"arith.maxsi": np.maximum}),
         "arith.minsi": _fast_ufunc({"arith.minsi": np.minimum}),
         "vector.extract": _fast_position(_lanes_position),
         "llvm.extractvalue": _fast_position(
             lambda op: int(re.search(r"position = array<i64: (\d+)>", op.props).group(1)))}
_FAST.update({name: _fast_ufunc(_INT_BINARY, "first") for name in _INT_BINARY})
_FAST.update({name: _fast_ufunc(_BITWISE) for name in _BITWISE})
_FAST.update({name: _fast_ufunc(_FLOAT_BINARY, np.float32) for name in _FLOAT_BINARY})
