"""pip install . : configures and builds the _attnbench extension with the project's CMake build
(the same flags as `make build`, without tests), and puts it, the pure-Python package and the
standard fixtures into the wheel. ATTN_CMAKE_BUILD_DIR reuses a configured build folder (e.g.
build, that of `make build`) instead of a fresh one under build-pip/."""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _builder_reason():
    """Why this interpreter cannot build the wheel with pip --no-build-isolation, or None: setuptools
    before 70.1 builds wheels only with the `wheel` package, which Debian's Python has
    (python3-wheel) and a venv of another Python (pyenv's, a venv without system site packages)
    lacks."""
    import setuptools

    try:
        import wheel  # noqa: F401
        return None
    except ImportError:
        pass
    version = tuple(int(x) for x in setuptools.__version__.split(".")[:2] if x.isdigit())
    if version >= (70, 1):
        return None
    return (f"attnbench: {sys.executable} (Python {sys.version.split()[0]}, setuptools {setuptools.__version__}) "
            "has no `wheel` package, so pip cannot build attnbench's wheel with it ('invalid command "
            "bdist_wheel'). Make the venv from Debian's Python, which has it and which attn embeds: "
            "/usr/bin/python3 -m venv --system-site-packages V && V/bin/pip install --no-build-isolation . "
            "(docs/python.md), or first: V/bin/pip install wheel")


if {"bdist_wheel", "dist_info", "build_ext", "install"} & set(sys.argv[1:]):
    _why = _builder_reason()
    if _why:
        sys.exit(_why)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.environ.get("ATTN_CMAKE_BUILD_DIR") or os.path.join(HERE, "build-pip", "cmake")
        build = os.path.abspath(build)
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            subprocess.run(["cmake", "-S", HERE, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                            "-DATTN_BUILD_TESTS=OFF", f"-DPython_EXECUTABLE={sys.executable}"], check=True)
        subprocess.run(["cmake", "--build", build, "--target", "_attnbench"], check=True)
        built = os.path.join(build, "python", "attnbench")
        module = next(f for f in os.listdir(built) if f.startswith("_attnbench") and f.endswith(".so"))
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(built, module), target)
        # The standard fixtures travel inside the package (attnbench.default_fixtures()).
        fixtures = os.path.join(os.path.dirname(target), "fixtures")
        shutil.rmtree(fixtures, ignore_errors=True)
        shutil.copytree(os.path.join(HERE, "fixtures", "golden"), fixtures)


os.makedirs(os.path.join(HERE, "build-pip"), exist_ok=True)
setup(ext_modules=[CMakeExtension("attnbench._attnbench")], cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}})
