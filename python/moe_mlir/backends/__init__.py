"""Backends: ``dynamo`` (the ``torch.compile`` backend ``"moe"``: raising, then inductor), ``cpu`` (the whole-graph
MLIR path: moe-opt, executor, mlir-runner), ``cuda`` (the whole-graph CUDA split), ``tools`` (finding and running the
MLIR tools). Each imports the frontend and the printer, never the other way round."""
