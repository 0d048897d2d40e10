//===- moe-opt.cpp - The optimizer driver of the moe dialect --------------===//
//
// Part of the MoE-MLIR project.
//
// The whole tool is moeOptMain (OptMain.cpp): linked in (moe-opt), or in
// libmoe_compiler.so (moe-opt-static, the wheel's moe-opt).
//
//===----------------------------------------------------------------------===//

#include "MoE/Tools/OptMain.h"

int main(int argc, char **argv) { return moeOptMain(argc, argv); }
