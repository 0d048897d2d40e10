//===- Utils.h - Forwards to MoE/Conversion/MoEToLinalg/Utils.h -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The builders moved to the public header; this forwarder keeps the lowerings
// written against the old path building until they include the new one.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/MoEToLinalg/Utils.h"
