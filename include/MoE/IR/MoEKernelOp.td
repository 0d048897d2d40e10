//===- MoEKernelOp.td - The destination-style kernel op ----*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// Not part of the DIALECT.md contract: the op the kernel conversions
// (convert-moe-to-cpu) lower a routing op into. It carries a kernel written on
// buffers inside a tensor program, so that upstream one-shot bufferization
// (not the conversions) decides where every buffer comes from: the kernel
// names what it reads (ins) and what it writes (outs), and bufferization
// gives it buffers for both.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEKERNELOP_TD
#define MOE_IR_MOEKERNELOP_TD

include "mlir/Dialect/Bufferization/IR/BufferizableOpInterface.td"
include "mlir/Interfaces/DestinationStyleOpInterface.td"

def MoE_KernelOp : MoE_Op<"kernel", [
    AttrSizedOperandSegments,
    DestinationStyleOpInterface,
    NoMemoryEffect,
    SingleBlockImplicitTerminator<"KernelEndOp">,
    DeclareOpInterfaceMethods<BufferizableOpInterface, [
      "bufferizesToMemoryRead", "bufferizesToMemoryWrite",
      "getAliasingValues", "bufferize"]>]> {
  let summary = "a kernel on buffers with tensor ins and outs (destination style)";
  let description = [{
    A computation written on memrefs, placed in a tensor program. Its one-block region has one memref block argument
    per operand, in order (`ins` then `outs`): the buffer of that operand, with the operand's element type, a shape
    compatible with the operand's (equal where both are static; canonicalization may make an operand more static
    than the body was built for), the identity layout and any memory space. The region reads the `ins` buffers and
    writes every element of each `outs` buffer whose result is used; it does not read an `outs` buffer before
    writing it (its initial contents are unspecified) and does not write an `ins` buffer. Result `i` is the tensor
    written into out `i`. The region reaches memory only through its block arguments and buffers it allocates
    itself: it uses no tensor or memref value defined above it (index values and constants from above are fine). The
    op has no other effect, so an unused kernel may be erased.

    One-shot bufferization (BufferizableOpInterface) replaces the op by its region: each operand's buffer (cast
    to the block argument's type, or copied when its layout is not the identity) takes the place of the block
    argument, and the results become the out buffers. An out that is a `tensor.empty` becomes one allocation; an
    out that one-shot may write in place (a writable function argument) is written in place.

    Example:

    ```mlir
    %e = tensor.empty(%n) : tensor<?xf32>
    %r = moe.kernel ins(%x : tensor<?xf32>) outs(%e : tensor<?xf32>) {
    ^bb0(%xb: memref<?xf32>, %rb: memref<?xf32>):
      memref.copy %xb, %rb : memref<?xf32> to memref<?xf32>
    } -> tensor<?xf32>
    ```
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$inputs,
                       Variadic<AnyRankedTensor>:$outputs);
  let results = (outs Variadic<AnyRankedTensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    (`ins` `(` $inputs^ `:` type($inputs) `)`)?
    `outs` `(` $outputs `:` type($outputs) `)`
    $body attr-dict (`->` type($results)^)?
  }];
  let skipDefaultBuilders = 1;
  let builders = [
    /// A kernel over `inputs` and `outputs` with an empty body whose block
    /// arguments have the identity-layout memref types of the operands.
    OpBuilder<(ins "ValueRange":$inputs, "ValueRange":$outputs)>
  ];
  let extraClassDeclaration = [{
    /// The body's block.
    ::mlir::Block &getBlock() { return getBody().front(); }
    /// The buffers of the ins and of the outs inside the body.
    ::mlir::Block::BlockArgListType getInputBuffers() {
      return getBlock().getArguments().take_front(getInputs().size());
    }
    ::mlir::Block::BlockArgListType getOutputBuffers() {
      return getBlock().getArguments().drop_front(getInputs().size());
    }
    /// DestinationStyleOpInterface.
    ::mlir::MutableOperandRange getDpsInitsMutable() {
      return getOutputsMutable();
    }
  }];
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
}

def MoE_KernelEndOp : MoE_Op<"kernel_end", [
    Pure, Terminator, HasParent<"KernelOp">]> {
  let summary = "terminator of moe.kernel (implicit in the assembly)";
  let description = [{
    Ends the body of a `moe.kernel`; the results are in the out buffers, so it takes no operands. The custom
    assembly of `moe.kernel` leaves it out.
  }];
  let assemblyFormat = "attr-dict";
}

#endif // MOE_IR_MOEKERNELOP_TD
