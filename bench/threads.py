"""The thread count of a benchmark run, pinned before torch (and the kernels we compile or load) read it.

Every benchmark module calls :func:`pin_threads` before importing torch: OpenMP, MKL, OpenBLAS and our own kernels
take their worker counts from the environment at start-up, so the same count holds for every implementation timed
in the run.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

_VARIABLES = ("OMP_NUM_THREADS", "MOE_NUM_THREADS", "MKL_NUM_THREADS")


def threads_from_argv(default: int) -> int:
    """``--threads N`` or ``--threads=N`` from the command line (argparse parses it again later), else ``default``."""
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return int(sys.argv[i + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return default


def pin_threads(default: int, extra_variables: Sequence[str] = ()) -> int:
    """Sets the thread variables (plus ``extra_variables``) to the run's thread count and returns it."""
    threads = threads_from_argv(default)
    for v in (*_VARIABLES, *extra_variables):
        os.environ[v] = str(threads)
    return threads
