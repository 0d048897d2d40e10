"""Expert parallelism: our dispatch + combine against a plain-PyTorch all-to-all dispatcher written the way
TorchTitan writes its ``AllToAllTokenDispatcher`` (same run, same processes, same gloo group, alternated).

Both implement TorchTitan's interface: ``dispatch(x, scores, ids, counts) -> routed_input`` (one row per (token,
local expert), sorted by local expert), then ``combine(routed_output, ...) -> [T, D]`` with the scores applied. The
experts are the identity (the benchmark measures the token movement, not the GEMMs). Per case: the slowest rank's
time of dispatch + combine (forward), as tokens per second per rank, the median of the repetitions; and the bytes
each rank sends to the *other* ranks in one dispatch + combine, against the minimum (each token row once per other
rank that owns one of its experts, each way). The baseline sends one row per (token, expert): ``T·k`` rows.

Usage: ``python bench/expert_parallel.py [--ranks 2 4] [--reps 7] [--out bench/results/expert-parallel-<date>]``.
Gloo on CPU, one thread per rank: on a shared 2-core machine the ranks compete for the cores, so the numbers are
noisy; the ratio is measured in the same processes with the two dispatchers alternated.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# (tokens per rank, hidden size, experts, k): Qwen3-30B-A3B-like widths scaled to a CPU.
CASES = [(512, 2048, 128, 8), (2048, 2048, 128, 8), (4096, 1024, 64, 4), (2048, 4096, 256, 8)]


class TitanStyleDispatcher:
    """TorchTitan's AllToAllTokenDispatcher, in plain PyTorch: argsort by expert, ``T·k`` rows, count exchange,
    token all-to-all, permute to local-expert-major order; combine: unpermute, all-to-all back, scores in f32,
    scatter_add into the tokens."""

    def __init__(self, num_experts: int, top_k: int, world: int) -> None:
        self.E, self.k, self.W = num_experts, top_k, world
        self.El = num_experts // world

    def dispatch(self, x, scores, ids, counts):
        order = torch.argsort(ids.view(-1), stable=True)
        sorted_scores = scores.view(-1)[order]
        token = order // self.k
        routed = x[token]
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)  # [W * El]: per (source rank, local expert)
        in_splits = counts.view(self.W, -1).sum(1).tolist()
        out_splits = recv_counts.view(self.W, -1).sum(1).tolist()
        recv = routed.new_empty((sum(out_splits), x.shape[1]))
        dist.all_to_all_single(recv, routed, out_splits, in_splits)
        # received rows are (source rank, local expert)-major: permute to local-expert-major
        per = recv_counts.view(self.W, self.El)
        src_expert = torch.repeat_interleave(torch.arange(self.W * self.El), per.reshape(-1))
        key = (src_expert % self.El) * self.W + src_expert // self.El
        perm = torch.argsort(key, stable=True)
        meta = (token, sorted_scores, in_splits, out_splits, perm, x.shape)
        return recv[perm], per.sum(0), meta

    def combine(self, out, meta):
        token, sorted_scores, in_splits, out_splits, perm, shape = meta
        unperm = torch.empty_like(out)
        unperm[perm] = out
        back = out.new_empty((sum(in_splits), shape[1]))
        dist.all_to_all_single(back, unperm, in_splits, out_splits)
        back = (back.float() * sorted_scores[:, None]).to(back.dtype)
        y = torch.zeros(shape, dtype=out.dtype)
        return y.scatter_add(0, token[:, None].expand(-1, shape[1]), back)


def _route(T, E, k, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g)
    w, ids = torch.ops.moe.route(logits, None, k, "softmax", "score_then_topk", 1, 1, "top2_sum", True, 1.0)
    return w, ids


def _worker(rank, world, port, reps, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    from moe_mlir import expert_parallel as ep

    rows = []
    for T, D, E, k in CASES:
        w, ids = _route(T, E, k, 100 + rank)
        x = torch.randn(T, D, generator=torch.Generator().manual_seed(rank))
        counts = torch.bincount(ids.view(-1).long(), minlength=E)
        ours = ep.TorchTitanDispatcher(E, k)
        base = TitanStyleDispatcher(E, k, world)

        def run_ours():
            routed, _, md = ours.dispatch(x, w, ids, counts)
            return ours.combine(routed, md, x)

        def run_base():
            routed, _, md = base.dispatch(x, w, ids.long(), counts)
            return base.combine(routed, md)

        y1, y2 = run_ours(), run_base()  # warm-up, and the same result
        err = float((y1 - y2).abs().max())
        times = {"ours": [], "titan_style": []}
        for _ in range(reps):
            for name, fn in (("ours", run_ours), ("titan_style", run_base)):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the slowest rank's time
                times[name].append(float(dt))
        # bytes this rank sends to other ranks (dispatch + combine)
        _, _, md = ours.dispatch(x, w, ids, counts)
        h = md.dispatched.handle
        owner = ours.layout.rank_of(ids)
        other = owner != rank
        row = D * x.element_size()
        minimum_rows = sum(len(set(r) - {rank}) for r in owner.tolist())
        back_rows = sum(n for r, n in enumerate(h.recv_splits) if r != rank)
        traffic = ep.traffic(h, row, 2 * k * 4)
        rec = dict(world=world, rank=rank, T=T, D=D, E=E, k=k, max_abs_diff=err,
                   ours_ms=1e3 * statistics.median(times["ours"]),
                   titan_style_ms=1e3 * statistics.median(times["titan_style"]),
                   ours_ms_all=[1e3 * t for t in times["ours"]],
                   titan_style_ms_all=[1e3 * t for t in times["titan_style"]],
                   bytes_min=2 * minimum_rows * row,
                   bytes_ours_rows=traffic["dispatch_rows"] + traffic["combine_rows"],
                   bytes_ours_meta=traffic["dispatch_meta"] + 8 * 39 * (world - 1),
                   bytes_titan_rows=2 * int(other.sum()) * row,
                   bytes_titan_meta=8 * (E // world) * (world - 1),
                   combine_rows_back=back_rows)
        rows.append(rec)
    q.put((rank, rows))
    dist.destroy_process_group()


def _machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "loadavg_before": os.getloadavg(), "torch": torch.__version__,
            "backend": "gloo (CPU), one thread per rank, all ranks on this machine"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=f"bench/results/expert-parallel-{datetime.date.today()}")
    args = ap.parse_args()
    machine = _machine()
    records = []
    for world in args.ranks:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(r, world, port, args.reps, q)) for r in range(world)]
        for p in procs:
            p.start()
        got = dict(q.get(timeout=3600) for _ in procs)
        for p in procs:
            p.join()
        for i in range(len(CASES)):
            per_rank = [got[r][i] for r in range(world)]
            r0 = dict(per_rank[0])
            for key in ("bytes_min", "bytes_ours_rows", "bytes_ours_meta", "bytes_titan_rows", "bytes_titan_meta"):
                r0[key] = sum(p[key] for p in per_rank)  # over all ranks
            r0["max_abs_diff"] = max(p["max_abs_diff"] for p in per_rank)
            r0["speedup"] = r0["titan_style_ms"] / r0["ours_ms"]
            r0["tokens_per_s_ours"] = r0["T"] / (r0["ours_ms"] / 1e3)
            r0["tokens_per_s_titan_style"] = r0["T"] / (r0["titan_style_ms"] / 1e3)
            del r0["rank"]
            records.append(r0)
            print(f"W={world} T={r0['T']} D={r0['D']} E={r0['E']} k={r0['k']}: ours {r0['ours_ms']:.1f} ms, "
                  f"titan-style {r0['titan_style_ms']:.1f} ms ({r0['speedup']:.2f}x); rows bytes ours "
                  f"{r0['bytes_ours_rows'] / 2**20:.1f} MiB = min {r0['bytes_min'] / 2**20:.1f} MiB, titan-style "
                  f"{r0['bytes_titan_rows'] / 2**20:.1f} MiB; max |diff| {r0['max_abs_diff']:.2e}", flush=True)
    machine["loadavg_after"] = os.getloadavg()
    doc = {"machine": machine, "date": str(datetime.datetime.now()), "cases": records}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    lines = ["# Expert parallelism: dispatch + combine, ours vs a TorchTitan-style all-to-all dispatcher",
             "", f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['backend']}; torch {machine['torch']};"
             f" load average before {machine['loadavg_before'][0]:.1f}, after {machine['loadavg_after'][0]:.1f} "
             "(shared machine: noisy; the ratio is from the same processes, alternated).", "",
             "Time: the slowest rank's dispatch + combine (forward, identity experts), median of the repetitions. "
             "Bytes: sent between different ranks in one dispatch + combine, summed over ranks; minimum = each token "
             "row once per other rank owning one of its experts, each way. Ours also sends 2k x 4 bytes of gate "
             "weights and ids per row and a 312-byte header per peer (column meta).", "",
             "| ranks | T/rank | D | E | k | ours ms | titan-style ms | speed-up | tok/s/rank ours | rows MiB ours |"
             " min MiB | titan-style MiB | ours meta KiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['world']} | {r['T']} | {r['D']} | {r['E']} | {r['k']} | {r['ours_ms']:.1f} | "
                     f"{r['titan_style_ms']:.1f} | {r['speedup']:.2f}x | {r['tokens_per_s_ours']:.0f} | "
                     f"{r['bytes_ours_rows'] / 2**20:.2f} | {r['bytes_min'] / 2**20:.2f} | "
                     f"{r['bytes_titan_rows'] / 2**20:.2f} | {r['bytes_ours_meta'] / 2**10:.1f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.json')} and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
