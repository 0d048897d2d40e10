"""The MLIR printer of the whole-graph path: ``builder`` (a small text builder and the dtype tables), ``importer``
(an exported program printed as ``func.func @forward``), ``table`` + ``lowerings`` (the aten → linalg/moe table)."""
