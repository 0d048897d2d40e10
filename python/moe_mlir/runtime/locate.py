"""Where the build's tools and libraries are: the lowest layer, used by the runtime (kernel cache, torch extension)
and by the backends alike.

Two layouts:

* **installed from the wheel** (``scripts/build-wheel.sh``, docs/Install.md): the compiled pieces ship inside the
  package, ``moe_mlir/_bundle/{bin,lib}`` (moe-opt, the torch extension, the kernel runtime libraries), with their
  run paths set to ``$ORIGIN``; ``_bundle/system.json`` lists what they need from the system (Debian's LLVM/MLIR 22
  shared libraries and tools), checked when the package is imported (:func:`check_system`, a few ``stat`` calls);
* **the source tree** (the editable developer install): no bundle; the build directories ``$MOE_BUILD_DIR``,
  ``<repo>/build``, ``<repo>/build-py``.

Tool discovery: ``$MOE_OPT``, else the bundle's moe-opt, else ``<build>/bin/moe-opt``, else ``moe-opt`` on PATH;
``$MOE_AOT``, else the bundle's ``moe-aot.py``, else ``<repo>/tools/moe-aot/moe-aot.py``;
``$MLIR_RUNNER`` or ``/usr/lib/llvm-22/bin/mlir-runner``; runtime libraries next to moe-opt (``../lib``), else in the
bundle or the build directories.

Imports nothing but the standard library: the ``moe-opt`` console script (``_moe_mlir_cli``) loads this file alone,
without importing the package (and torch).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Callable, Optional

__all__ = ["find_moe_opt", "find_moe_aot", "find_mlir_runner", "find_runtime_lib", "bundle_dir", "missing_system_packages",
           "system_packages_message", "check_system", "MissingSystemPackages", "LLVM_BIN", "LLVM_LIB", "REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parents[3]
LLVM_BIN = Path("/usr/lib/llvm-22/bin")
LLVM_LIB = Path("/usr/lib/llvm-22/lib")
#: The compiled pieces of an installed wheel (absent in the source tree).
_BUNDLE = Path(__file__).resolve().parents[1] / "_bundle"


def bundle_dir() -> Optional[Path]:
    """``moe_mlir/_bundle`` when the package was installed from the wheel, else None (the source tree)."""
    return _BUNDLE if (_BUNDLE / "bin" / "moe-opt").is_file() else None


def _build_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("MOE_BUILD_DIR"):
        d = Path(os.environ["MOE_BUILD_DIR"])
        dirs.append(d if d.is_absolute() else REPO_ROOT / d)
    dirs += [REPO_ROOT / "build", REPO_ROOT / "build-py"]
    return dirs


def find_moe_opt(search_path: bool = True) -> Optional[str]:
    """Path of a usable ``moe-opt`` or None (``search_path=False``: not on PATH, where the console script is)."""
    env = os.environ.get("MOE_OPT")
    if env:
        return env if os.access(env, os.X_OK) else None
    bundle = bundle_dir()
    dirs = [bundle] if bundle else _build_dirs()
    for d in dirs:
        p = d / "bin" / "moe-opt"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    found = shutil.which("moe-opt") if search_path else None
    return None if found is None or _is_script(found) else found


def _is_script(path: str) -> bool:
    """Whether ``path`` is a script (the package's own console script ``moe-opt``, which runs the moe-opt found
    here), not the tool."""
    with open(path, "rb") as f:
        return f.read(2) == b"#!"


def find_moe_aot() -> Optional[str]:
    """Path of ``moe-aot.py`` (the command-line ahead-of-time GPU object tool of the GPU check, stdlib-only Python;
    the package's CUDA builds do not run it): ``$MOE_AOT``, the bundle's copy, else the source tree's
    ``tools/moe-aot/moe-aot.py``; None when none exists."""
    env = os.environ.get("MOE_AOT")
    bundle = bundle_dir()
    p = Path(env) if env else (bundle / "bin" if bundle else REPO_ROOT / "tools" / "moe-aot") / "moe-aot.py"
    return str(p) if p.is_file() else None


def find_mlir_runner() -> Optional[str]:
    env = os.environ.get("MLIR_RUNNER")
    if env:
        return env
    p = LLVM_BIN / "mlir-runner"
    if p.is_file():
        return str(p)
    return shutil.which("mlir-runner-22") or shutil.which("mlir-runner")


def find_runtime_lib(name: str) -> Optional[str]:
    moe_opt = find_moe_opt()
    cands = []
    if moe_opt:
        cands.append(Path(moe_opt).resolve().parents[1] / "lib" / name)
    bundle = bundle_dir()
    cands += [bundle / "lib" / name] if bundle else [d / "lib" / name for d in _build_dirs()]
    for c in cands:
        if c.is_file():
            return str(c)
    return None


class RuntimeLibrary:
    """One of our libraries with a C ABI for ctypes (the compiler, the key builders), loaded once, at its first use,
    with its symbols local: ``$<env>`` when set (None if that file is missing), else :func:`find_runtime_lib`;
    ``declare(lib)`` sets its functions' ctypes signatures; ``error`` is raised when it is not found."""

    def __init__(self, name: str, env: str, error: type, declare: Callable[[ctypes.CDLL], None]) -> None:
        self.name, self.env, self.error, self.declare = name, env, error, declare
        self._lib: Optional[ctypes.CDLL] = None
        self._lock = threading.Lock()

    def path(self) -> Optional[str]:
        env = os.environ.get(self.env)
        if env:
            return env if os.path.isfile(env) else None
        return find_runtime_lib(self.name)

    def __call__(self) -> ctypes.CDLL:
        with self._lock:
            if self._lib is None:
                path = self.path()
                if path is None:
                    raise self.error(f"{self.name} not found: build it (cmake --build build) or set {self.env}")
                lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
                self.declare(lib)
                self._lib = lib
            return self._lib


# ----------------------------------------------------------------------------------------------------------------
# What an installed wheel needs from the system
# ----------------------------------------------------------------------------------------------------------------


class MissingSystemPackages(ImportError):
    """The installed package's compiled pieces need Debian packages this machine lacks (the message names them)."""


def _present(entry: dict) -> bool:
    return (any(os.path.exists(p) for p in entry.get("paths", ()))
            or any(shutil.which(c) is not None for c in entry.get("commands", ())))


def missing_system_packages(needed_by: Optional[str] = None) -> list[dict]:
    """The entries of ``_bundle/system.json`` this machine lacks (empty in the source tree). An entry is a shared
    library or a tool, ``{"what", "package", "needed_by", "paths", "commands"}``: present when one of ``paths``
    exists (where the dynamic loader would find the library: the run path, then the system directories; the wheel
    is built for Debian's ``/usr/lib/llvm-22``) or one of ``commands`` is on PATH. ``needed_by``: only the entries
    of that piece (e.g. ``"moe-opt"``)."""
    bundle = bundle_dir()
    if bundle is None or not (bundle / "system.json").is_file():
        return []
    entries = json.loads((bundle / "system.json").read_text())
    return [e for e in entries if (needed_by is None or needed_by in e["needed_by"]) and not _present(e)]


def system_packages_message(missing: list[dict]) -> str:
    packages = list(dict.fromkeys(e["package"] for e in missing))
    what = "; ".join(f"{e['package']} ({e['what']}, for {', '.join(e['needed_by'])})" for e in missing)
    return (f"moe_mlir needs {', '.join(packages)}, missing on this machine: {what}. On Debian: "
            f"apt install {' '.join(packages)} (MoE-MLIR's docs/Install.md lists what the wheel needs). "
            "MOE_MLIR_SKIP_SYSTEM_CHECK=1 skips this check.")


def check_system() -> None:
    """Raises :class:`MissingSystemPackages` naming the Debian packages the installed wheel's pieces need and this
    machine lacks (nothing in the source tree, or with ``$MOE_MLIR_SKIP_SYSTEM_CHECK=1``)."""
    if os.environ.get("MOE_MLIR_SKIP_SYSTEM_CHECK") == "1":
        return
    missing = missing_system_packages()
    if missing:
        raise MissingSystemPackages(system_packages_message(missing))


# At `import moe_mlir` (this module is imported by it), not when the console script loads this file alone.
if __name__ == "moe_mlir.runtime.locate":
    check_system()
