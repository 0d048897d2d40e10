//===- KernelThreads.h - Lend another pool's threads to kernels -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The kernels' parallel loops run on libmoe_kernel_runtime's pool
// (lib/Runtime/CPU/AsyncRuntime.cpp). Inside a process that already has a
// pool of its own, torch's OpenMP team, two pools share the cores: after an
// eager op torch's threads spin for a while, and a kernel's task then waits
// for a core behind them (a 1.4 ms GEMV took 1.3-2.9 ms, median 2.3, on a
// 2-core machine). The torch extension therefore runs each kernel inside an
// OpenMP region: the caller runs the kernel, the team's other threads run
// its tasks (moeKernelRuntimeServe), and the runtime's own threads are not
// woken meanwhile.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_KERNELTHREADS_H
#define MOE_RUNTIME_KERNELTHREADS_H

#include <cstdint>

extern "C" {
/// From now until the matching moeKernelRuntimeHelpersEnd, threads that call
/// moeKernelRuntimeServe run the tasks: the runtime's parked threads stay
/// parked (submitting a task wakes none of them, and one whose wait returns
/// anyway goes back to sleep); those still spinning before they park take
/// tasks too. The last helpersEnd wakes them for tasks left in the queue.
void moeKernelRuntimeHelpersBegin();
void moeKernelRuntimeHelpersEnd();
/// Runs queued tasks until `*done` (read with acquire ordering) is nonzero.
void moeKernelRuntimeServe(const int32_t *done);
/// How many of the runtime's threads are parked now (tests: a thread counted
/// here takes no task while helpers are registered).
int64_t moeKernelRuntimeParkedThreads();
}

#endif // MOE_RUNTIME_KERNELTHREADS_H
