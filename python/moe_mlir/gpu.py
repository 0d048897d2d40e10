"""Compatibility module: the CUDA target moved to :mod:`moe_mlir.backends.cuda` (``moe_mlir.gpu`` is that module)."""

import sys

from .backends import cuda as _cuda

sys.modules[__name__] = _cuda
