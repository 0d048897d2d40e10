"""Compatibility module: moved to :mod:`moe_mlir.mlir.builder` (``moe_mlir._mlir`` is that module)."""

import sys

from .mlir import builder as _moved

sys.modules[__name__] = _moved
