"""The build step of the C extension lazy_core._native (everything else is in pyproject.toml).

The extension is required: without a C++ compiler the install stops here with a message that
says what to install, instead of a compiler's traceback.
"""

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

_MISSING = """
lazy-torch needs a C++17 compiler to build its C extension (lazy_core._native), and building it
failed (the compiler's output is above). Install one, then run the install again:
  Debian/Ubuntu:  apt install g++        Fedora/RHEL:  dnf install gcc-c++
  macOS:          xcode-select --install  conda:        conda install cxx-compiler
The same compiler also builds lazy_torch's torch-linked extension at first import.
"""


class BuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except (CCompilerError, ExecError, PlatformError) as e:
            raise SystemExit(f"error: {e}\n{_MISSING}") from e


setup(cmdclass={"build_ext": BuildExt})
