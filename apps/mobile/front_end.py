"""The mobile app's front end: the LiteRT.js files the page loads, where they come from, and the
copy of them that the wheel carries.

Two homes, tried in this order by `apps/mobile/build.py`:

    vendor/         inside the package: the wheel and the sdist carry it, so an installed
                    keras-vit serves the app with no Node.js (`vendor()` fills it at build time)
    the npm cache   `front_end_folder()`: `npm ci` of package-lock.json, per user, for a
                    source checkout that has no vendor/ (`build.ensure_front_end()`)

A home counts only when it holds every file the page loads from every package at the version
package-lock.json pins, so a vendor/ left from an older lock is passed over.

Standard library only: setup.py loads this file by path to fill vendor/ while the wheel is
built, where neither keras-vit nor its dependencies are installed.
"""

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK = HERE / "package-lock.json"
PACKAGED = HERE / "vendor"
# LiteRT.js picks the relaxed-SIMD build where the browser has it, else the compatible one, and
# the JSPI build for WebGPU; the threaded build is not used (it needs cross-origin isolation).
VENDOR_FILES = (
    "@litertjs/core/dist/index.js",
    "@litertjs/wasm-utils/dist/index.js",
    "@litertjs/core/wasm/litert_wasm_internal.js",
    "@litertjs/core/wasm/litert_wasm_internal.wasm",
    "@litertjs/core/wasm/litert_wasm_compat_internal.js",
    "@litertjs/core/wasm/litert_wasm_compat_internal.wasm",
    "@litertjs/core/wasm/litert_wasm_jspi_internal.js",  # WebGPU runs from the JSPI build
    "@litertjs/core/wasm/litert_wasm_jspi_internal.wasm",
)


def locked_versions():
    """{package: version} for every package package-lock.json installs."""
    lock = json.loads(LOCK.read_text())
    return {
        name.removeprefix("node_modules/"): entry["version"]
        for name, entry in lock["packages"].items()
        if name.startswith("node_modules/")
    }


def installed_version(folder, package):
    """The version of `package` in `folder` (a node_modules or a vendor/), from its package.json."""
    manifest = Path(folder) / package / "package.json"
    return json.loads(manifest.read_text())["version"] if manifest.exists() else None


def holds_front_end(folder):
    """Whether `folder` has every locked package at its locked version and every file the page loads."""
    folder = Path(folder)
    versions = all(installed_version(folder, name) == version for name, version in locked_versions().items())
    # npm reports success on a full disk, leaving empty .wasm files: an empty file is a missing one.
    files = all((folder / name).is_file() and (folder / name).stat().st_size for name in VENDOR_FILES)
    return versions and files


def front_end_folder():
    """The per-user folder LiteRT.js is installed into: `$XDG_CACHE_HOME` (default ~/.cache)
    `/keras-vit/mobile-front-end/<hash of package-lock.json>`, so a new lock gets a new folder."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "keras-vit" / "mobile-front-end" / hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]


def packaged_front_end():
    """The package's own copy (vendor/) when it is complete and matches the lock, else None."""
    return PACKAGED if holds_front_end(PACKAGED) else None


def vendor(node_modules, into=PACKAGED):
    """Copies the files the page loads, and each locked package's package.json (its version),
    from `node_modules` into `into` (replaced whole); returns `into`.

    Raises:
        ValueError: `node_modules` lacks a locked package, a version, or a file the page loads.
    """
    node_modules, into = Path(node_modules), Path(into)
    if not holds_front_end(node_modules):
        raise ValueError(
            f"{node_modules} does not hold LiteRT.js as {LOCK} pins it: run `npm ci` there "
            "(or `bash scripts/setup.sh apps`)."
        )
    into.parent.mkdir(parents=True, exist_ok=True)
    # Copied beside its final name and renamed into place: an interrupted copy leaves nothing.
    staging = Path(tempfile.mkdtemp(prefix=f".{into.name}-", dir=into.parent))
    try:
        for name in (*VENDOR_FILES, *(f"{package}/package.json" for package in locked_versions())):
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(node_modules / name, staging / name)
        if into.exists():
            shutil.rmtree(into)
        os.replace(staging, into)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return into
