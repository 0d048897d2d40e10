"""Compatibility module: moved to :mod:`moe_mlir.mlir.importer` (``moe_mlir.importer`` is that module)."""

import sys

from .mlir import importer as _moved

sys.modules[__name__] = _moved
