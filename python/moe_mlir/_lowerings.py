"""Compatibility module: moved to :mod:`moe_mlir.mlir.lowerings` (``moe_mlir._lowerings`` is that module)."""

import sys

from .mlir import lowerings as _moved

sys.modules[__name__] = _moved
