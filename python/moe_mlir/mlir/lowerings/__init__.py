"""The entries of :data:`moe_mlir.mlir.table.LOWERINGS`: one function per ATen (or ``moe``) op family.

Each lowering receives the importer, the FX node and its arguments bound by schema name (FX nodes replaced by
:class:`~moe_mlir.mlir.builder.Value` s) and returns the Value (or tuple of Values) of the node. Result types always
come from the node's ``meta["val"]`` (torch's own shape and dtype inference), so the lowerings only compute.

One module per op family: :mod:`.elementwise`, :mod:`.creation`, :mod:`.reductions`, :mod:`.linalg`, :mod:`.views`,
:mod:`.indexing` and :mod:`.moe_ops`; helpers they share in :mod:`._common`. Importing the package fills the table.
"""

from . import creation, elementwise, indexing, linalg, moe_ops, reductions, views  # noqa: F401  (fill LOWERINGS)
