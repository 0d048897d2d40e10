"""``python -m moe_mlir.runtime.prebuild KEYS OUT_DIR [--chip sm_90]``: builds the CUDA kernels of the keys in file
KEYS (one per line, as ``$MOE_KERNEL_RECORD`` writes them) for the chip into OUT_DIR, the layout
``$MOE_KERNEL_PREBUILT`` reads (:func:`moe_mlir.runtime.cache.prebuild_cuda`). Needs moe-opt, LLVM and the CUDA
toolkit, no GPU: scripts/gpu-check.sh runs it for the GPU machine, which has no LLVM."""

from __future__ import annotations

import argparse
from pathlib import Path

from .cache import prebuild_cuda


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe_mlir.runtime.prebuild", description=__doc__)
    ap.add_argument("keys", help="file of kernel keys, one per line")
    ap.add_argument("out_dir")
    ap.add_argument("--chip", default="sm_90")
    ap.add_argument("-j", "--jobs", type=int, default=None, help="builds at a time (default: the CPU count)")
    args = ap.parse_args(argv)
    keys = [line.strip() for line in Path(args.keys).read_text().splitlines() if line.strip()]
    n = prebuild_cuda(keys, Path(args.out_dir), args.chip, args.jobs)
    print(f"prebuild: {n} CUDA kernels built, {len(set(keys)) - n} already there, in {args.out_dir} for {args.chip}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
