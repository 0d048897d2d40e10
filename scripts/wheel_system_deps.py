#!/usr/bin/env python3
"""``wheel_system_deps.py BUNDLE TORCH_LIB``: writes ``BUNDLE/system.json``, what the wheel's compiled pieces need
from the system (read by ``moe_mlir.runtime.locate.check_system`` at ``import moe_mlir``): scripts/build-wheel.sh
runs it after setting the pieces' run paths.

* every shared library an ELF file of ``BUNDLE/{bin,lib}`` names (DT_NEEDED), except those the bundle has, those
  torch ships (``TORCH_LIB``: loaded by ``import torch`` before the extension) and the C and C++ run-time libraries
  the wheel's manylinux tag promises, with the paths the dynamic loader would try (the file's run path, then the
  system directories) and the Debian package of the file it finds here.

The compiler is in the bundle (libmoe_compiler.so links LLVM and MLIR statically), so no tool is needed: the list
is empty for a wheel built from the default configuration (python/tests/test_wheel.py asserts it). What only the
whole-graph CUDA and runner paths use (the CUDA toolkit, LLVM's tools, ``c++``) is checked where it is used.

A library that does not resolve here (``libcuda.so.1``: the GPU driver, only loaded with a GPU) is left out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

SYSTEM_DIRS = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/lib", "/usr/lib"]
#: What every manylinux platform provides (PEP 600: the C library and GCC's C++ run time).
MANYLINUX_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libstdc++.so.6",
                  "libgcc_s.so.1", "ld-linux-x86-64.so.2", "libutil.so.1", "libresolv.so.2"}


def run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def debian_package(path: str) -> str:
    """The package owning ``path`` (its real file: /usr/lib/llvm-22/lib/libLLVM.so.22.1 is llvm-22-dev's link to
    libllvm22's library), without the architecture."""
    for p in (os.path.realpath(path), path):
        out = run("dpkg", "-S", p)
        if out:
            return out.split(":", 1)[0].split(",")[0].strip()
    raise SystemExit(f"wheel_system_deps: no Debian package owns {path}")


def needed_and_runpath(elf: Path) -> tuple[list[str], list[str]]:
    dyn = run("readelf", "-d", str(elf))
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dyn)
    m = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.+?)\]", dyn)
    runpath = m.group(1).split(":") if m else []
    return needed, runpath


def resolved(elf: Path) -> dict[str, str]:
    """soname -> the file the dynamic loader loads here (ldd)."""
    out = {}
    for line in run("ldd", str(elf)).splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def main() -> int:
    bundle, torch_lib = Path(sys.argv[1]), Path(sys.argv[2])
    ours = {p.name for p in (bundle / "lib").iterdir()}
    torch_ships = {p.name for p in torch_lib.iterdir()}
    entries: dict[str, dict] = {}
    for elf in sorted([*(bundle / "bin").iterdir(), *(bundle / "lib").iterdir()]):
        needed, runpath = needed_and_runpath(elf)
        found = resolved(elf)
        for soname in needed:
            if soname in ours or soname in torch_ships or soname in MANYLINUX_LIBS or soname not in found:
                continue
            dirs = [d for d in runpath if "$ORIGIN" not in d] + SYSTEM_DIRS
            e = entries.setdefault(soname, {"what": soname, "package": debian_package(found[soname]),
                                            "needed_by": [], "paths": [f"{d}/{soname}" for d in dirs]})
            e["needed_by"].append(elf.name)
    (bundle / "system.json").write_text(json.dumps(list(entries.values()), indent=1) + "\n")
    for e in entries.values():
        print(f"  needs {e['package']:16} {e['what']} (for {', '.join(e['needed_by'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
