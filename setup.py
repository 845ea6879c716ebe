"""setuptools hook: a non-editable install carries the engine's sources.

`pip install .` copies SConstruct, kernels/, templates/ and profiles/ into
colibri_build/engine/ of the installed package, so the binding and the tuner can build
the library from any folder (colibri_build/paths.py looks there first). An editable
install reads them from the checkout and copies nothing. Everything else is in
pyproject.toml.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ENGINE = ("SConstruct", "kernels", "templates", "profiles")


class build_py_with_engine(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "colibri_build" / "engine"
        for name in ENGINE:
            src = HERE / name
            if src.is_dir():
                shutil.copytree(src, dest / name, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)


setup(cmdclass={"build_py": build_py_with_engine})
