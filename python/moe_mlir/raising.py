"""Compatibility module: raising moved to :mod:`moe_mlir.frontend.raising`."""

from .frontend.raising import raise_routing_idioms  # noqa: F401
