"""What pyproject.toml cannot say statically: the wheel with the compiled pieces.

In the source tree (the editable developer install) this is a pure-Python package that needs ``torch``.

``scripts/build-wheel.sh`` stages a copy of the package with ``moe_mlir/_bundle`` (moe-opt, the torch extension, the
kernel runtime libraries, ``build.json`` and ``system.json``) and builds it here: then the wheel

* carries the bundle as package data;
* is a platform wheel (``cp311-cp311-manylinux_2_N_x86_64``): the extension is compiled against this Python's
  headers, and ``N`` is the newest glibc symbol version the pieces need (``build.json``'s ``platform``);
* requires the torch minor release the extension was built against (``build.json``): libtorch has no stable C++ ABI
  across minor releases.
"""

import json
from pathlib import Path

from setuptools import setup
from setuptools.dist import Distribution

BUNDLE = Path(__file__).resolve().parent / "moe_mlir" / "_bundle"
BUILD_INFO = BUNDLE / "build.json"


class BinaryDistribution(Distribution):
    """A distribution with compiled code, so that bdist_wheel tags the wheel for this Python and platform."""

    def has_ext_modules(self):
        return BUILD_INFO.is_file()


if BUILD_INFO.is_file():
    torch_version = json.loads(BUILD_INFO.read_text())["torch"]
    major, minor = (int(x) for x in torch_version.split(".")[:2])
    install_requires = [f"torch>={major}.{minor},<{major}.{minor + 1}"]
    package_data = {"moe_mlir": ["_bundle/*.json", "_bundle/bin/*", "_bundle/lib/*"]}
    platform = json.loads(BUILD_INFO.read_text()).get("platform")
    options = {"bdist_wheel": {"plat_name": platform}} if platform else {}
else:
    install_requires = ["torch>=2.4"]
    package_data = {}
    options = {}

setup(distclass=BinaryDistribution, install_requires=install_requires, package_data=package_data, options=options)
