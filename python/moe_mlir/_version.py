"""The one place the version is written: pyproject.toml reads it (``[tool.setuptools.dynamic]``), and so does the
build, for ``moe-opt --version`` (tools/moe-opt/CMakeLists.txt). Keep it a plain string literal: both parse it."""

__version__ = "0.1.0"
