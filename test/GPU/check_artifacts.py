#!/usr/bin/env python3
"""Checks a manifest that tools/moe-aot/moe-aot.py wrote (NAME.manifest.json):
it names the toolkit and the driver the binary needs, every embedded binary is
a fatbinary with a cubin for the chip, every binary has its uncompressed PTX
fallback under the name the runtime looks for (moe-<FNV-1a 64 of the binary>
.ptx, recomputed here from the object file), and every file matches its
sha256. Used by the lit test aot-manifest.mlir and by the GPU check before it
runs anything.

  check_artifacts.py NAME.manifest.json [--require-ptx]

Prints one line per finding; exit 1 when something is wrong.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load_aot():
    """tools/moe-aot/moe-aot.py (fnv1a64, fatbin_entries), from the checkout or a copy beside this file."""
    for path in (os.path.join(HERE, "..", "..", "tools", "moe-aot", "moe-aot.py"),
                 os.path.join(HERE, "moe-aot.py")):
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location("moe_aot", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
    sys.exit("check_artifacts: moe-aot.py not found")


def embedded_fatbins(data, magic):
    """Every fatbinary (header + payload) inside an object file."""
    out, i = [], data.find(struct.pack("<I", magic))
    while i >= 0:
        _, _, header, size = struct.unpack_from("<IHHQ", data, i)
        out.append(data[i:i + header + size])
        i = data.find(struct.pack("<I", magic), i + header + size)
    return out


def check(manifest_path, require_ptx):
    aot = load_aot()
    root = os.path.dirname(os.path.abspath(manifest_path))
    m = json.load(open(manifest_path))
    problems = []

    def ok(msg):
        print(f"ok: {msg}")

    assert aot.fnv1a64(b"a") == 0xaf63dc4c8601ec8c, "FNV-1a 64 test vector"
    ptxas = (m.get("toolkit") or {}).get("ptxas")
    if not ptxas or not re.match(r"^\d+\.\d+", ptxas):
        problems.append("the manifest does not name the toolkit (ptxas version)")
    else:
        ok(f"toolkit ptxas {ptxas}; the binary needs a CUDA {m.get('binary_needs_cuda')} driver")
    for f, digest in m.get("files", {}).items():
        p = os.path.join(root, f)
        if not os.path.exists(p):
            problems.append(f"{f} is missing")
        elif hashlib.sha256(open(p, "rb").read()).hexdigest() != digest:
            problems.append(f"{f} does not match its sha256")
    ok(f"{len(m.get('files', {}))} files listed")
    obj = os.path.join(root, m["name"] + ".o")
    keys = {}
    if os.path.exists(obj):
        for blob in embedded_fatbins(open(obj, "rb").read(), aot.FATBIN_MAGIC):
            keys[f"{aot.fnv1a64(blob):016x}"] = blob
    chip = int(m["chip"].split("_")[1].rstrip("a"))
    fallbacks = {p["fnv1a64"]: p for p in m.get("ptx_fallback", [])}
    for b in m.get("binaries", []):
        kinds = {(e["kind"], e["sm"]) for e in b.get("fatbin", [])}
        if m.get("format") == "fatbin" and ("cubin", chip) not in kinds:
            problems.append(f"{b['symbol']}: no cubin for sm_{chip} in the fatbinary ({sorted(kinds)})")
        if b["fnv1a64"] not in keys:
            problems.append(f"{b['symbol']}: key {b['fnv1a64']} matches no fatbinary in {m['name']}.o")
        else:
            ok(f"{b['symbol']}: {b['bytes']} bytes, key {b['fnv1a64']} recomputed from the object, "
               f"entries {sorted(kinds)}")
        fb = fallbacks.get(b["fnv1a64"])
        if fb is None:
            (problems.append if require_ptx else print)(f"{b['symbol']}: no PTX fallback")
            continue
        path = os.path.join(root, fb["ptx_file"])
        text = open(path, "rb").read() if os.path.exists(path) else b""
        if os.path.basename(path) != f"moe-{b['fnv1a64']}.ptx" or b".version" not in text[:4096]:
            problems.append(f"{b['symbol']}: bad PTX fallback {fb['ptx_file']}")
        elif not re.search(rb"^\.version\s+" + re.escape(fb["ptx_isa"].encode()), text, re.M):
            problems.append(f"{b['symbol']}: {fb['ptx_file']} is not PTX ISA {fb['ptx_isa']}")
        else:
            ok(f"{b['symbol']}: PTX fallback {fb['ptx_file']} (ISA {fb['ptx_isa']}, {fb['ptx_target']}, "
               f"needs a CUDA {fb['ptx_needs_cuda']} driver)")
    if not m.get("binaries"):
        problems.append("no embedded binary found")
    for p in problems:
        print(f"error: {p}")
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("manifest")
    ap.add_argument("--require-ptx", action="store_true")
    args = ap.parse_args()
    return check(args.manifest, args.require_ptx)


if __name__ == "__main__":
    sys.exit(main())
