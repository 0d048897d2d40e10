"""The frontend: from a torch model to an FX graph with its routing raised to ``torch.ops.moe.*``
(``export``: torch.export for the whole-graph path; ``raising``: the idiom rewrites; ``partitioning``: splitting the
moe ops from the rest for the CUDA target)."""
