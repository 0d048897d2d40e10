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
the warp-level ops per warp: nvgpu.ldmatrix (x1/x2/x4, .trans), nvgpu.mma.sync (f16) and nvvm.mma.sync (bf16)
m16n8k16 (products exact, sums in float64 rounded to f32: the tensor cores' own summation order is not
modelled), nvgpu.device_async_copy (zero fill past src-size), memref.subview (unit strides) and memref.view of
gpu.dynamic_shared_memory, llvm.mlir.poison (zeros), vector from_elements/extract/insert/bitcast/
load/store, arith.truncf to f16/bf16 (round to nearest even). Vectors are arrays (lanes, *shape); f16/bf16
values are their bits (uint16) throughout.

The dispatch plan's kernels (DispatchPlan.cpp) add nvvm.match.sync (any), math.ctpop/cttz and the error word's
llvm.inttoptr, cmpxchg (lanes in order), getelementptr and store on a global int64 buffer (Memory.add); its scan
kernel (a block of 256 threads with barriers) runs with `lockstep=True`.

Only what the route, top-k, dispatch-plan and flash-mma kernels use is implemented; an unknown op raises.
"""
import os
import re
import subprocess
import threading

import numpy as np

LANES = 32


def find_moe_opt():
    """The moe-opt that emits the kernels under test: $MOE_OPT, else the build's; None where there is none."""
    path = os.environ.get("MOE_OPT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                                     "build", "bin", "moe-opt")
    return path if os.path.exists(path) else None


def lower(moe_opt, text, options=""):
    """`text` through `moe-opt --convert-moe-to-gpu=OPTIONS --mlir-print-op-generic` (what parse() reads)."""
    return subprocess.run([moe_opt, "-", f"--convert-moe-to-gpu={options}", "--mlir-print-op-generic"],
                          input=text, capture_output=True, text=True, check=True).stdout

OP = re.compile(r'^\s*(?:(?P<res>%[^=]+?) = )?"(?P<name>[\w.]+)"\((?P<args>[^)]*)\)(?P<rest>.*)$')
BLOCK = re.compile(r"^\s*\^bb\d+(?:\((?P<args>.*)\))?:\s*$")


class Op:
    __slots__ = ("name", "results", "args", "props", "types", "regions")

    def __init__(self, name, results, args, props, types):
        self.name, self.results, self.args, self.props, self.types = name, results, args, props, types
        self.regions = []


def _results(res):
    if not res:
        return []
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


def parse(text, func_name):
    """The body (a list of blocks: (arg names, ops)) of gpu.func `func_name`."""
    lines = text.splitlines()
    pos = [0]

    def parse_regions(first_rest):
        regions = []
        blocks = []
        cur_args, cur_ops = [], []
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
                cur_ops, started = [], True
                continue
            if s.startswith("}"):
                if started or cur_ops:
                    blocks.append((cur_args, cur_ops))
                regions.append(blocks)
                blocks, cur_args, cur_ops, started = [], [], [], False
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

    def load16(self, address):
        for base, array, elt in self.buffers:
            if base <= address < base + array.nbytes:
                raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
                off = int(address - base)
                return np.frombuffer(raw[off:off + 16].tobytes(), dtype=np.int32)
        raise IndexError(hex(address))


def run_kernel(body, args, block_dim, grid, memory, smem_shape=None, workgroup=(), lockstep=False,
               dynamic_smem=0, async_copies="issue", warp_threads=False):
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
    branches of their own between barriers: flash-mma-lazy-rescale's warps leave its hot loop at tiles of their
    own), instead of one lockstep group."""
    block_args = body[0][0]
    dims = tuple(grid) + (1,) * (3 - len(grid)) if isinstance(grid, tuple) else (grid, 1, 1)
    for z in range(dims[2]):
        for y in range(dims[1]):
            for b in range(dims[0]):
                smem = [np.zeros(smem_shape, dtype=np.float32)] if smem_shape else []
                smem += [np.zeros(shape, dtype=dt) for shape, dt in workgroup]
                dyn = np.zeros(dynamic_smem, dtype=np.uint8)
                if warp_threads:
                    _run_warp_threads(body, args + smem, block_dim, memory, b, (y, z), dims, dyn, async_copies)
                    continue
                lanes = block_dim if lockstep else LANES
                for w in range(block_dim // lanes):
                    env = {}
                    for name, a in zip(block_args, args + smem):
                        env[name] = a
                    warp = Warp(env, memory, b, w, lanes=lanes, block_yz=(y, z), grid=dims)
                    warp.dynamic_smem, warp.async_copies = dyn, async_copies
                    warp.run_block(body[0][1], np.ones(lanes, bool))


def _run_warp_threads(body, values, block_dim, memory, block, block_yz, dims, dyn, async_copies):
    """One block, a thread a warp (run_kernel's warp_threads): gpu.barrier waits for every warp; an error in one
    warp breaks the barrier for the others and is raised."""
    warps = block_dim // LANES
    barrier = threading.Barrier(warps, timeout=600)
    errors = []

    def go(w):
        try:
            env = dict(zip(body[0][0], values))
            warp = Warp(env, memory, block, w, lanes=LANES, block_yz=block_yz, grid=dims)
            warp.dynamic_smem, warp.async_copies, warp.barrier = dyn, async_copies, barrier
            warp.run_block(body[0][1], np.ones(LANES, bool))
            # A warp that returns leaves the barrier to the others only once they are past their last one.
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=go, args=(w,)) for w in range(warps)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        first = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)] or errors
        raise first[0]


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
        self.pending, self.groups = [], []   # cp.async copies not landed: this group's, committed groups

    def get(self, name):
        return self.env[name]

    def run_block(self, ops, mask, block_args=None, values=None):
        if block_args:
            for n, v in zip(block_args, values):
                self.env[n] = v
        for op in ops:
            out = self.step(op, mask)
            if op.name in ("scf.yield", "scf.condition", "gpu.return"):
                return out
            if out is not None:
                if not isinstance(out, (list, tuple)):
                    out = [out]
                for n, v in zip(op.results, out):
                    self.env[n] = v
        return None

    def region(self, op, i, mask, values=()):
        args, ops = op.regions[i][0]
        return self.run_block(ops, mask, args, list(values))

    def step(self, op, mask):
        n = op.name
        a = [self.get(x) for x in op.args]
        if n == "arith.constant":
            return _const(op, self.n)
        if n == "gpu.thread_id":
            return self.tid.copy()
        if n == "gpu.block_id":
            d = re.search(r"dim (\w)", op.props).group(1)
            v = {"x": self.block, "y": self.block_yz[0], "z": self.block_yz[1]}[d]
            return np.full(self.n, v, dtype=np.int64)
        if n == "gpu.grid_dim":
            d = re.search(r"dim (\w)", op.props).group(1)
            return np.full(self.n, self.grid["xyz".index(d)], dtype=np.int64)
        if n == "memref.dim":
            return np.full(self.n, a[0].shape[int(a[1][0])], dtype=np.int64)
        if n in ("arith.addi", "arith.subi", "arith.muli"):
            f = {"arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply}[n]
            with np.errstate(over="ignore"):
                return f(a[0], a[1]).astype(a[0].dtype)
        if n == "arith.ceildivui":
            ua, ud = _unsigned(a[0]), _unsigned(np.where(a[1] == 0, 1, a[1]))
            return ((ua + ud - 1) // ud).astype(a[0].dtype)
        if n in ("arith.divui", "arith.remui"):
            d = np.where(a[1] == 0, 1, a[1])
            ua, ud = _unsigned(a[0]), _unsigned(d)
            r = ua // ud if n == "arith.divui" else ua % ud
            return r.astype(a[0].dtype)
        if n in ("arith.andi", "arith.ori", "arith.xori"):
            f = {"arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor}[n]
            return f(a[0], a[1])
        if n == "arith.shli":
            return np.left_shift(a[0], a[1].astype(a[0].dtype))
        if n == "arith.shrsi":
            return np.right_shift(a[0], a[1].astype(a[0].dtype))
        if n == "arith.shrui":
            return np.right_shift(_unsigned(a[0]), _unsigned(a[1].astype(a[0].dtype))).astype(a[0].dtype)
        if n in ("arith.maxsi", "arith.minsi"):
            return (np.maximum if n == "arith.maxsi" else np.minimum)(a[0], a[1])
        if n == "arith.minui":
            return np.minimum(_unsigned(a[0]), _unsigned(a[1])).astype(a[0].dtype)
        if n == "arith.cmpi":
            pred = int(_prop(op, "predicate").split(":")[0])
            if pred >= 6:
                x, y = _unsigned(a[0]), _unsigned(a[1])
                return {6: x < y, 7: x <= y, 8: x > y, 9: x >= y}[pred]
            return CMPI[pred](a[0], a[1])
        if n == "arith.cmpf":
            return _cmpf(int(_prop(op, "predicate").split(":")[0]), a[0], a[1])
        if n == "arith.select":
            c = a[0].reshape(a[0].shape + (1,) * (np.ndim(a[1]) - np.ndim(a[0])))
            return np.where(c, a[1], a[2])
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
        if n in ("arith.addf", "arith.subf", "arith.mulf", "arith.divf"):
            f = {"arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply,
                 "arith.divf": np.divide}[n]
            with np.errstate(all="ignore"):
                return f(a[0], a[1]).astype(np.float32)
        if n in ("arith.maximumf", "arith.minimumf"):
            f = np.maximum if n == "arith.maximumf" else np.minimum   # NaN-propagating, as arith's
            return f(a[0], a[1]).astype(np.float32)
        if n == "arith.negf":
            return -a[0]
        if n == "math.exp":
            with np.errstate(all="ignore"):
                return np.exp(a[0]).astype(np.float32)
        if n == "math.log":
            with np.errstate(all="ignore"):
                return np.log(a[0]).astype(np.float32)
        if n in ("math.log1p", "math.sqrt", "math.absf", "math.tanh"):
            f = {"math.log1p": np.log1p, "math.sqrt": np.sqrt, "math.absf": np.abs, "math.tanh": np.tanh}[n]
            with np.errstate(all="ignore"):
                return f(a[0]).astype(np.float32)
        if n == "math.fma":
            return (a[0] * a[1] + a[2]).astype(np.float32)
        if n == "llvm.call_intrinsic":
            name = re.search(r'intrin = "([^"]+)"', op.props).group(1)
            with np.errstate(all="ignore"):
                if "ex2.approx" in name:
                    return np.exp2(a[0]).astype(np.float32)
                if "rcp.approx" in name:
                    return (np.float32(1.0) / a[0]).astype(np.float32)
            raise NotImplementedError(name)
        if n == "memref.extract_aligned_pointer_as_index":
            i, arr = self.arrays[id(a[0])]
            return np.full(self.n, self.mem.buffers[i][0], dtype=np.int64)
        if n == "llvm.inline_asm":
            assert "ld.global.nc.v4.b32" in op.props
            words = np.zeros((4, self.n), dtype=np.int32)
            for l in range(self.n):
                if mask[l]:
                    words[:, l] = self.mem.load16(int(a[0][l]))
            return [tuple(words)]
        if n == "llvm.extractvalue":
            pos = int(re.search(r"position = array<i64: (\d+)>", op.props).group(1))
            return a[0][pos]
        if n == "memref.load":
            arr = a[0]
            idx = [np.where(mask, i, 0) for i in a[1:]]
            return arr[tuple(idx)] if arr.ndim else np.full(self.n, arr)
        if n == "memref.store":
            arr = a[1]
            for l in range(self.n):
                if mask[l]:
                    arr[tuple(int(i[l]) for i in a[2:])] = a[0][l]
            return None
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
            out = np.empty(LANES, dtype=a[0].dtype)
            for l in range(LANES):
                m = int(a[1][l]) & 0xFFFFFFFF
                lanes = [j for j in range(LANES) if m >> j & 1]
                out[l] = (max if kind == "max" else min)(a[0][j] for j in lanes)
            return out
        if n == "nvvm.bar.warp.sync":
            return None
        if n == "scf.if":
            cond = a[0]
            take = cond & mask
            skip = ~cond & mask
            has_else = len(op.regions) > 1 and op.regions[1] and op.regions[1][0][1]
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
        out = self.step_mma(op, n, a, mask)
        if out is not NotImplemented:
            return out
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
        if n == "vector.from_elements":
            shape, _t = _vector_shape(op.types[0])
            return np.stack(a, axis=1).reshape((self.n,) + shape)
        if n == "vector.extract":
            pos = tuple(int(x) for x in re.search(r"static_position = array<i64: ([\d, ]+)>", op.props)
                        .group(1).split(","))
            return a[0][(slice(None),) + pos].copy()
        if n == "vector.insert":
            pos = tuple(int(x) for x in re.search(r"static_position = array<i64: ([\d, ]+)>", op.props)
                        .group(1).split(","))
            out = a[1].copy()
            out[(slice(None),) + pos] = a[0]
            return out
        if n == "vector.bitcast":
            src = re.search(r"\((vector<[^>]+>)\) -> ", op.props).group(1)
            (sshape, st), (dshape, dt) = _vector_shape(src), _vector_shape(op.types[0])
            assert st in ("bf16", "f16") and dt == "i32" and sshape[-1] == 2 * dshape[-1], (src, op.types[0])
            bits = a[0].astype(np.uint16).reshape(self.n, -1, 2).astype(np.uint32)
            return (bits[:, :, 0] | bits[:, :, 1] << 16).view(np.int32).reshape((self.n,) + dshape)
        if n == "arith.truncf":
            t = op.types[0]
            vec = _vector_shape(t)
            et = vec[1] if vec else t
            assert et in ("bf16", "f16"), t
            return _f32_to_bits(a[0], et)
        if n == "vector.load":
            shape, _t = _vector_shape(op.types[0])
            arr, idx = a[0], a[1:]
            width = shape[-1]
            out = np.zeros((self.n, width), dtype=arr.dtype)
            for l in range(self.n):
                if mask[l]:
                    i = [int(x[l]) for x in idx]
                    out[l] = arr[tuple(i[:-1])][i[-1]:i[-1] + width]
            return out
        if n == "vector.store":
            val, arr, idx = a[0], a[1], a[2:]
            for l in range(self.n):
                if mask[l]:
                    i = [int(x[l]) for x in idx]
                    arr[tuple(i[:-1])][i[-1]:i[-1] + val.shape[-1]] = val[l]
            return None
        if n == "nvgpu.device_async_copy":
            seg = [int(x) for x in re.search(r"operandSegmentSizes = array<i32: ([\d, ]+)>", op.props)
                   .group(1).split(",")]
            dst, didx = a[0], a[1:1 + seg[1]]
            src = a[1 + seg[1]]
            sidx = a[2 + seg[1]:2 + seg[1] + seg[3]]
            count = a[2 + seg[1] + seg[3]] if seg[4] else None
            elems = int(re.search(r"dstElements = (\d+)", op.props).group(1))
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
        if n == "nvgpu.ldmatrix":
            return self._ldmatrix(op, a, mask)
        if n in ("nvgpu.mma.sync", "nvvm.mma.sync"):
            return self._mma(op, n, a)
        return NotImplemented

    def _ldmatrix(self, op, a, mask):
        tiles = int(re.search(r"numTiles = (\d+)", op.props).group(1))
        trans = "transpose = true" in op.props
        smem, rows, cols = a[0], a[1], a[2]
        out = np.zeros((self.n, tiles, 2), dtype=np.uint16)
        for w0 in range(0, self.n, LANES):
            if not mask[w0:w0 + LANES].all():
                raise AssertionError("ldmatrix with inactive lanes")
            for i in range(tiles):
                m = np.stack([smem[int(rows[w0 + 8 * i + r]), int(cols[w0 + 8 * i + r]):
                                   int(cols[w0 + 8 * i + r]) + 8] for r in range(8)])
                if trans:
                    m = m.T
                for l in range(LANES):
                    out[w0 + l, i] = m[l // 4, 2 * (l % 4):2 * (l % 4) + 2]
        return out

    def _mma(self, op, n, a):
        """m16n8k16 row.col on each warp: A [16 x 16], B [16 x 8] (k x n), C/D [16 x 8] f32."""
        if n == "nvgpu.mma.sync":
            t = "f16"
            af, bf = a[0].reshape(self.n, 8), a[1].reshape(self.n, 4)
            c = a[2].reshape(self.n, 4)
        else:
            t = re.search(r"multiplicandAPtxType = #nvvm.mma_type<(\w+)>", op.props).group(1)
            assert t in ("bf16", "f16"), t

            def unpack(words):
                w = np.stack(words, axis=1).astype(np.int32).view(np.uint32)
                return np.stack([w & 0xFFFF, w >> 16], axis=2).reshape(self.n, -1).astype(np.uint16)
            af, bf = unpack(a[0:4]), unpack(a[4:6])
            c = np.stack(a[6:10], axis=1)
        av, bv = _bits_to_f32(af, t), _bits_to_f32(bf, t)
        d = np.zeros((self.n, 4), dtype=np.float32)
        for w0 in range(0, self.n, LANES):
            A = np.zeros((16, 16))
            B = np.zeros((16, 8))
            C = np.zeros((16, 8))
            for l in range(LANES):
                g, q = l // 4, l % 4
                x = av[w0 + l]
                A[g, 2 * q:2 * q + 2], A[g + 8, 2 * q:2 * q + 2] = x[0:2], x[2:4]
                A[g, 2 * q + 8:2 * q + 10], A[g + 8, 2 * q + 8:2 * q + 10] = x[4:6], x[6:8]
                y = bv[w0 + l]
                B[2 * q:2 * q + 2, g], B[2 * q + 8:2 * q + 10, g] = y[0:2], y[2:4]
                z = c[w0 + l]
                C[g, 2 * q:2 * q + 2], C[g + 8, 2 * q:2 * q + 2] = z[0:2], z[2:4]
            with np.errstate(all="ignore"):
                D = (A @ B + C).astype(np.float32)
            for l in range(LANES):
                g, q = l // 4, l % 4
                d[w0 + l] = [D[g, 2 * q], D[g, 2 * q + 1], D[g + 8, 2 * q], D[g + 8, 2 * q + 1]]
        if n == "nvgpu.mma.sync":
            return d.reshape(self.n, 2, 2)
        return [tuple(d[:, i] for i in range(4))]
