// tools/moe-tblgen -gen-moe-kernel-keys on the kernel-key table (include/MoE/IR/KernelKeys.td): each key gets a
// builder derived from its op's ODS arguments (operands by name, optional where ODS says so; attributes converted
// to their ODS return type and built with their constant builder, `Required`, `Defaulted` or `Optional`; the
// segment sizes of an op with optional operands; renamed names), and the dispatch lists every key; the table's
// mistakes are tblgen errors.
// RUN: moe-tblgen -gen-moe-kernel-keys %tblgen_includes %s | FileCheck %s
// RUN: not moe-tblgen -gen-moe-kernel-keys -D TWICE %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not moe-tblgen -gen-moe-kernel-keys -D RENAME %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=RENAME
// RUN: not moe-tblgen -gen-moe-kernel-keys -D NOT_OP %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=NOT-OP

include "MoE/IR/KernelKeys.td"

#ifdef TWICE
def : KernelKey<"route", MoE_RouteOp>;
#endif
#ifdef RENAME
def : KernelKey<"route_renamed", MoE_RouteOp, [KeyRename<"w", "no_such_operand">]>;
#endif
#ifdef NOT_OP
def : KernelKey<"not_an_op", GradW>;
#endif

// CHECK-LABEL: buildKey_hyper_router_backward(
// CHECK:   args.ignoreAttr("weight_grads");

// CHECK-LABEL: static ::mlir::Operation *buildKey_route(::mlir::OpBuilder &b, KernelKeyArgs &args) {
// CHECK:   args.operand("logits", false, operands, segments);
// CHECK:   args.operand("bias", true, operands, segments);
// CHECK:   args.operand("replay", true, operands, segments);
// CHECK:   if (auto v = args.attr<uint64_t>("k", KeyAttrKind::Required))
// CHECK-NEXT: attrs.push_back(b.getNamedAttr("k", b.getIntegerAttr(b.getIntegerType(64), (*v))));
// CHECK:   if (auto v = args.attr<::mlir::moe::RouteScoring>("scoring", KeyAttrKind::Defaulted))
// CHECK-NEXT: attrs.push_back(b.getNamedAttr("scoring", ::mlir::moe::RouteScoringAttr::get(b.getContext(), (*v))));
// CHECK:   if (auto v = args.attr<::llvm::APFloat>("routed_scaling_factor", KeyAttrKind::Defaulted))
// CHECK:   attrs.push_back(b.getNamedAttr("operandSegmentSizes", b.getDenseI32ArrayAttr(segments)));
// CHECK:   if (args.failed() || !args.allUsed("moe.route"))
// CHECK:   return createInferred<::mlir::moe::RouteOp>(b, args, operands, attrs, 1);

// CHECK-LABEL: buildKey_route_backward(
// CHECK:   args.operand("grad_w", false, operands, segments);
// CHECK-NOT: operandSegmentSizes
// CHECK:   return createInferred<::mlir::moe::RouteGradOp>(b, args, operands, attrs, 1);

// CHECK-LABEL: buildKey_dispatch_plan(
// CHECK:   if (auto v = args.attr<uint64_t>("capacity", KeyAttrKind::Optional))

// CHECK-LABEL: static ::mlir::Operation *buildFromKeyTable(
// CHECK:   if (keyOp == "topk_renorm")
// CHECK-NEXT: return buildKey_topk_renorm(b, args);
// CHECK:   known = false;
// CHECK:   static constexpr ::llvm::StringLiteral kKernelKeyOps[] = {
// CHECK-NEXT: "topk_renorm",

// TWICE: error: the key 'route' is given twice
// RENAME: error: 'no_such_operand' is no operand or attribute of moe.route
// NOT-OP: error: Value specified for template argument 'KernelKey:op' is of type KeyRename; expected type Op
