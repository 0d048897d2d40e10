#!/usr/bin/env python3
"""Copies the host sources of the GPU check folder (scripts/gpu-check.sh) from the repository into DEST/src, in the
repository's layout: the tracked files of the SEED paths, and everything they need, found by following

  * the quoted #includes of C/C++ files (beside the file, then include/), and
  * the ${MOE_SOURCE_DIR}/... and ${CMAKE_CURRENT_SOURCE_DIR}/... paths of CMake files (a folder: its
    CMakeLists.txt, for add_subdirectory) and the sources they name beside them, starting from the folder's own
    CMakeLists.txt (--cmake),

so that the list cannot go stale: a header or a CMake file that a new source starts to use travels with it (the
folder once lacked include/MoE/Runtime/KernelThreads.h, and the GPU machine's build stopped there). A CMake path
into the repository that names nothing tracked is an error, named.

  copy_sources.py ROOT DEST_SRC --cmake FOLDER_CMAKELISTS SEED...
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

CXX = (".c", ".cc", ".cpp", ".h", ".hpp", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
CMAKE_SOURCE = re.compile(r"(?<![${}/A-Za-z0-9_.-])([A-Za-z0-9_][A-Za-z0-9_./-]*\.(?:c|cc|cpp))\b")
CMAKE_PATH = re.compile(r"\$\{(MOE_SOURCE_DIR|CMAKE_CURRENT_SOURCE_DIR)\}/([A-Za-z0-9_./+-]+)")


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
    return set(p.decode() for p in out.split(b"\0") if p)


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("dest")
    ap.add_argument("--cmake", required=True, help="the folder's CMakeLists.txt (its ${MOE_SOURCE_DIR} paths)")
    ap.add_argument("seeds", nargs="+", help="files, folders or git pathspecs (globs) to copy")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    files = tracked(root)
    dirs = {}
    for f in files:                                   # folder -> its tracked files
        d = os.path.dirname(f)
        while d:
            dirs.setdefault(d, []).append(f)
            d = os.path.dirname(d)

    def expand(path):
        """A file: itself; a folder with a CMakeLists.txt (add_subdirectory): that; another folder (an include
        directory, which the #includes cover): nothing; None: not in the repository."""
        if path in files:
            return [path]
        if path in dirs:
            lists = os.path.join(path, "CMakeLists.txt")
            return [lists] if lists in files else []
        return None

    todo = []
    for seed in args.seeds:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--", seed], capture_output=True,
                             check=True).stdout
        hits = [p.decode() for p in out.split(b"\0") if p]
        if not hits:
            print(f"copy_sources: seed '{seed}' names no tracked file", file=sys.stderr)
            return 1
        todo += hits
    errors = []

    def cmake_refs(text, here, what):
        for rel in CMAKE_SOURCE.findall(text):        # add_library(x SHARED A.cpp B.cpp): beside the file
            path = os.path.normpath(os.path.join(here, rel))
            if here and path in files:
                todo.append(path)
        for base, rel in CMAKE_PATH.findall(text):
            path = os.path.normpath(rel if base == "MOE_SOURCE_DIR" else os.path.join(here, rel))
            if path.startswith(".."):
                continue
            hit = expand(path)
            if hit is None:
                # A source, header or CMake file that is not tracked; other names (the venv's python, which
                # the CMake code tests for) are not the folder's to carry.
                if path.endswith(CXX + (".cmake", ".txt", ".py")):
                    errors.append(f"{what} uses ${{{base}}}/{rel}, which is not a tracked file")
                continue
            todo.extend(hit)

    # The folder's CMakeLists.txt sits outside src/: only its paths into src/ count.
    cmake_refs(open(args.cmake).read(), "", args.cmake)
    done = set()
    while todo:
        f = todo.pop()
        if f in done:
            continue
        done.add(f)
        src = os.path.join(root, f)
        if f.endswith(CXX):
            for inc in INCLUDE.findall(open(src, errors="replace").read()):
                for cand in (os.path.normpath(os.path.join(os.path.dirname(f), inc)),
                             os.path.normpath(os.path.join("include", inc))):
                    if cand in files:
                        todo.append(cand)
                        break
        elif os.path.basename(f) == "CMakeLists.txt" or f.endswith(".cmake"):
            cmake_refs(open(src, errors="replace").read(), os.path.dirname(f), f)
    if errors:
        print("copy_sources: " + "\n  ".join(errors), file=sys.stderr)
        return 1
    for f in sorted(done):
        dst = os.path.join(args.dest, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(os.path.join(root, f), dst)
    print(f"copy_sources: {len(done)} files into {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
