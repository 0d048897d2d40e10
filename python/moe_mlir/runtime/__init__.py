"""The run-time layer of moe_mlir: what calls compiled kernels.

* :mod:`.abi`: memref descriptors and the dtype table, the one place that marshals torch tensors for compiled code
  (ctypes), shared by the package, ``bench/`` and the GPU tests (test/GPU/run_gpu_tests.py loads it by path);
* :mod:`.driver`: the compiler driver, every run of the build tools and the one disk cache of their products;
* :mod:`.cache`: the kernel cache behind ``torch.ops.moe.*`` (ahead-of-time compiled shared objects for the CPU and
  for CUDA devices, in memory and on disk);
* :mod:`.cuda`: the CUDA runtime as the torch ops' CUDA kernels use it; ``check_errors()`` reads their index errors;
* :mod:`.extension`: loads the C++ torch extension (``libmoe_torch.so``) and connects it to the cache.
"""
