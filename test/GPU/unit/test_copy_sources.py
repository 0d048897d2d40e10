"""Unit tests of test/GPU/check/copy_sources.py (the host sources of the GPU check folder), no GPU needed: a header
that a seed's source includes travels with it (the folder once lacked include/MoE/Runtime/KernelThreads.h and the GPU
machine's build stopped there), as do the files the CMake code names; a CMake path to an untracked source fails."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "check", "copy_sources.py")


def repo(tmp_path, files):
    root = tmp_path / "repo"
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    return root


def copy(root, dest, folder_cmake, *seeds):
    return subprocess.run([sys.executable, SCRIPT, str(root), str(dest), "--cmake", str(folder_cmake), *seeds],
                          capture_output=True, text=True)


FILES = {
    "include/MoE/Runtime/A.h": '#include "MoE/Runtime/B.h"\n',
    "include/MoE/Runtime/B.h": "// leaf\n",
    "include/MoE/Other.h": "// not needed\n",
    "lib/Runtime/CPU/CMakeLists.txt": "add_library(rt SHARED Run.cpp ${CMAKE_CURRENT_SOURCE_DIR}/../Err.cpp)\n"
                                      "target_include_directories(rt PUBLIC ${MOE_SOURCE_DIR}/include)\n",
    "lib/Runtime/CPU/Run.cpp": '#include "MoE/Runtime/A.h"\n#include "Local.h"\n#include <vector>\n',
    "lib/Runtime/CPU/Local.h": "// beside\n",
    "lib/Runtime/CPU/Unused.cpp": "// not in any CMake file, not a seed\n",
    "lib/Runtime/Err.cpp": "// named by the CMake file\n",
    "cmake/Extra.cmake": "set(X 1)\n",
    "check/CMakeLists.txt": "include(${MOE_SOURCE_DIR}/cmake/Extra.cmake)\n"
                            "add_subdirectory(${MOE_SOURCE_DIR}/lib/Runtime/CPU cpu)\n"
                            "add_library(a SHARED ${CMAKE_CURRENT_SOURCE_DIR}/art/a.o)\n",
}


def test_includes_and_cmake_paths_travel(tmp_path):
    root = repo(tmp_path, FILES)
    dest = tmp_path / "src"
    p = copy(root, dest, root / "check" / "CMakeLists.txt", "lib/Runtime/CPU/Run.cpp")
    assert p.returncode == 0, p.stderr
    got = sorted(os.path.relpath(os.path.join(d, f), dest) for d, _, fs in os.walk(dest) for f in fs)
    assert got == ["cmake/Extra.cmake", "include/MoE/Runtime/A.h", "include/MoE/Runtime/B.h",
                   "lib/Runtime/CPU/CMakeLists.txt", "lib/Runtime/CPU/Local.h", "lib/Runtime/CPU/Run.cpp",
                   "lib/Runtime/Err.cpp"]


def test_a_cmake_path_to_an_untracked_source_fails(tmp_path):
    files = dict(FILES)
    files["check/CMakeLists.txt"] += "add_executable(t ${MOE_SOURCE_DIR}/test/Missing.cpp)\n"
    root = repo(tmp_path, files)
    p = copy(root, tmp_path / "src", root / "check" / "CMakeLists.txt", "lib/Runtime/CPU")
    assert p.returncode == 1
    assert "${MOE_SOURCE_DIR}/test/Missing.cpp, which is not a tracked file" in p.stderr
    assert not (tmp_path / "src").exists()


def test_a_seed_that_names_nothing_fails(tmp_path):
    root = repo(tmp_path, FILES)
    p = copy(root, tmp_path / "src", root / "check" / "CMakeLists.txt", "lib/Runtime/GPU")
    assert p.returncode == 1
    assert "seed 'lib/Runtime/GPU' names no tracked file" in p.stderr
