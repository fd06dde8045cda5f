"""Install memr1: five top-level folders become subpackages of the `memr1` namespace.

Two native modules are built by CMakeLists.txt (C++17) and land next to their Python sources:
memory_store's core (pybind11) as `memr1.memory_store._core`, and the kernels' CPU operators (built
against the installed torch, registered with torch.library) as `memr1.kernels._native`.

The core opens the HNSW graphs that usearch's Python package saves with usearch's own header-only C++
core, of the same version, and walks them with usearch's heap types: its wheel carries no headers, so
they come from its source distribution on the package index (MEMR1_USEARCH_INCLUDE names a folder
holding usearch/index_dense.hpp instead, for offline builds).
"""
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SUBPACKAGES = ["engine", "kernels", "memory_store", "rl", "bench"]


def find_packages_under(folder: str) -> list[str]:
    found = []
    for init in sorted((ROOT / folder).rglob("__init__.py")):
        rel = init.parent.relative_to(ROOT / folder)
        found.append(".".join(["memr1", folder, *rel.parts]))
    return found


class CMakeExtension(Extension):
    def __init__(self, name: str, target: str):
        super().__init__(name, sources=[])
        self.target = target  # the CMake target that builds this module


def usearch_headers(cache: Path) -> Path:
    """A folder holding usearch/*.hpp of the installed usearch's version (from its sdist, once)."""
    given = os.environ.get("MEMR1_USEARCH_INCLUDE")
    if given:
        return Path(given).resolve()
    ver = version("usearch")
    include = cache / f"usearch-{ver}" / "include"
    if (include / "usearch" / "index_dense.hpp").exists():
        return include
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "usearch",
                        "--no-build-isolation", "-d", tmp, f"usearch=={ver}"], check=True)
        (sdist,) = Path(tmp).glob("usearch-*.tar.gz")
        with tarfile.open(sdist) as tar:  # only the headers and the licence, as plain files
            members = [m for m in tar.getmembers() if m.isfile() and (
                m.name.startswith(f"usearch-{ver}/include/usearch/") or m.name == f"usearch-{ver}/LICENSE")]
            tar.extractall(cache, members=members, filter="data")
    return include


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        build_dir = Path(self.build_temp).resolve() / ext.name
        build_dir.mkdir(parents=True, exist_ok=True)
        import pybind11

        cfg = os.environ.get("MEMR1_CMAKE_BUILD_TYPE", "Release")
        subprocess.run([
            "cmake", str(ROOT), f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DMEMR1_OUTPUT_DIR={out.parent}",
            f"-DMEMR1_OUTPUT_SUFFIX={sysconfig.get_config_var('EXT_SUFFIX')}",
            f"-DUSEARCH_INCLUDE_DIR={usearch_headers(ROOT / 'build')}",
        ], cwd=build_dir, check=True)
        subprocess.run(["cmake", "--build", ".", "--target", ext.target, "-j", str(os.cpu_count() or 2)],
                       cwd=build_dir, check=True)


setup(
    name="memr1",
    version="0.1.0",
    description="Memory-R1 trainer: RL for memory-managing LLM agents",
    python_requires=">=3.10",
    package_dir={f"memr1.{name}": name for name in SUBPACKAGES},
    packages=[p for name in SUBPACKAGES for p in find_packages_under(name)],
    package_data={"memr1.bench": ["*.sh"]},
    ext_modules=[CMakeExtension("memr1.memory_store._core", "memr1_core"),
                 CMakeExtension("memr1.kernels._native", "memr1_kernels_native")],
    cmdclass={"build_ext": CMakeBuild},
    install_requires=["torch>=2.13,<2.15", "transformers>=5.16.1", "usearch", "msgspec", "pyarrow", "numpy",
                      "safetensors", "tqdm", "tensorboard", "matplotlib"],
    entry_points={"console_scripts": ["memr1=memr1.engine.cli:run"]},
)
