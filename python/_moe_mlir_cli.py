"""The ``moe-opt`` console script of the installed package: runs the moe-opt that ships in ``moe_mlir/_bundle`` (in
the editable developer install, the build tree's).

A top-level module of its own: importing ``moe_mlir`` imports torch (seconds), and a command-line tool should start
at once, so this loads only ``moe_mlir/runtime/locate.py`` (standard library only), by path, without importing the
package.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _locate():
    spec = importlib.util.find_spec("moe_mlir")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("moe-opt: the moe_mlir package is not installed in this Python")
    path = os.path.join(list(spec.submodule_search_locations)[0], "runtime", "locate.py")
    loc_spec = importlib.util.spec_from_file_location("_moe_mlir_locate", path)
    module = importlib.util.module_from_spec(loc_spec)
    loc_spec.loader.exec_module(module)
    return module


def moe_opt() -> int:
    loc = _locate()
    if os.environ.get("MOE_MLIR_SKIP_SYSTEM_CHECK") != "1":
        missing = loc.missing_system_packages(needed_by="moe-opt")
        if missing:
            print(f"moe-opt: {loc.system_packages_message(missing)}", file=sys.stderr)
            return 1
    # Not on PATH: this script is the moe-opt there.
    tool = loc.find_moe_opt(search_path=False)
    if tool is None:
        print("moe-opt: no moe-opt in the moe_mlir package nor in the build tree: build it (cmake --build build) "
              "or set MOE_OPT", file=sys.stderr)
        return 1
    os.execv(tool, [tool, *sys.argv[1:]])
    return 1  # not reached: execv replaces the process or raises


if __name__ == "__main__":
    raise SystemExit(moe_opt())
