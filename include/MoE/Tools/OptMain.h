//===- OptMain.h - moe-opt's driver, as a function --------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TOOLS_OPTMAIN_H
#define MOE_TOOLS_OPTMAIN_H

extern "C" {
/// moe-opt: mlir-opt with the moe dialect, its passes and pipelines and every
/// upstream dialect, pass and LLVM IR translation; `argc`/`argv` as main's.
/// Returns the exit status.
int moeOptMain(int argc, char **argv);
}

#endif // MOE_TOOLS_OPTMAIN_H
