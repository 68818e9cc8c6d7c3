"""setuptools' build with one step added: the wheel and the sdist carry the mobile app's LiteRT.js.

Everything else is declared in pyproject.toml. Before setuptools lists the package's files for a
wheel or an sdist, `apps/mobile/vendor/` (git-ignored) is filled with the LiteRT.js files the
page loads, copied from the npm cache that `bash scripts/setup.sh apps` (or `dev`) fills, so an
installed keras-vit serves the phone app without Node.js. An editable install skips it: its app
reads the npm cache itself. A build from the sdist finds vendor/ already there.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

FRONT_END = Path(__file__).resolve().parent / "apps" / "mobile" / "front_end.py"


def _vendor_front_end():
    # Loaded by path: `import keras_vit` would need TensorFlow, which a build does not have.
    spec = importlib.util.spec_from_file_location("_keras_vit_front_end", FRONT_END)
    front_end = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(front_end)
    if front_end.packaged_front_end():
        return
    node_modules = front_end.front_end_folder() / "node_modules"
    if not front_end.holds_front_end(node_modules):
        raise SystemExit(
            "error: the wheel carries the mobile app's LiteRT.js, and the npm cache has none for "
            f"{front_end.LOCK.name} ({node_modules}): run `bash scripts/setup.sh apps` (npm ci, once), "
            "then build again."
        )
    front_end.vendor(node_modules)


class BuildPy(build_py):
    def run(self):
        if not self.editable_mode:
            _vendor_front_end()
            self.__dict__.pop("data_files", None)  # listed again, with vendor/ in it
        super().run()


class Sdist(sdist):
    def run(self):
        _vendor_front_end()
        super().run()


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
