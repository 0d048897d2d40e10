#!/usr/bin/env bash
# Regenerates the reference manual in docs/ from ODS (mlir-doc). test/docs-up-to-date.mlir fails when the
# committed copy is stale.
source "$(dirname "$0")/common.sh"
configure_and_build
cmake --build "$BUILD" --target mlir-doc
mkdir -p "$ROOT/docs"
cp "$BUILD"/docs/MoE/*.md "$ROOT/docs/"
echo "docs/ updated: $(ls "$ROOT"/docs/*.md | xargs -n1 basename | tr '\n' ' ')"
