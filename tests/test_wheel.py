"""The wheel as PyPI would get it: built once from a copy of the source tree (`python -m build
--wheel --no-isolation`: this environment's setuptools, no network), then read as a zip file.

Every module, the apps' web files, LiteRT.js's files the phone page loads (copied in by setup.py
from the npm cache that scripts/setup.sh fills), the embedded data, the model tables, the
embedded model when the tree has it, the `keras-vit` command, and the metadata's name and version.
scripts/check_wheel.sh installs the same wheel into a fresh environment and runs it.
"""

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import HANG_SECONDS

import keras_vit
from keras_vit.apps.mobile import front_end

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "keras-vision-transformers"
# Where each source folder lands in the wheel (pyproject.toml's package-dir).
INSTALLED_AS = {"keras_vit": "keras_vit", "export": "keras_vit/export", "apps": "keras_vit/apps"}
COPY_IGNORES = shutil.ignore_patterns(
    ".*", "node_modules", "vendor", "runs", "exports", "build", "dist", "*.egg-info", "__pycache__"
)


def _source_files(folder, pattern="*"):
    return [p for p in (ROOT / folder).rglob(pattern) if p.is_file() and "__pycache__" not in p.parts]


def _in_wheel(path):
    """The wheel's name for the source file `path` (absolute, inside ROOT)."""
    relative = path.relative_to(ROOT)
    return "/".join([INSTALLED_AS[relative.parts[0]], *relative.parts[1:]])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # A copy, so that the build's own folders (build/, *.egg-info, apps/mobile/vendor/) stay out
    # of the tree that other tests read at the same time.
    source = tmp_path_factory.mktemp("wheel") / "source"
    shutil.copytree(ROOT, source, ignore=COPY_IGNORES)
    out = source.parent / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, source],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    (path,) = out.glob("*.whl")
    with zipfile.ZipFile(path) as archive:
        yield path, {info.filename: info for info in archive.infolist()}, archive


def _dist_info(wheel, name):
    path, files, archive = wheel
    (member,) = [f for f in files if f.endswith(f".dist-info/{name}")]
    return archive.read(member).decode()


def test_the_wheel_is_named_for_the_distribution_and_the_package_version(wheel):
    path, _, _ = wheel
    assert path.name == f"keras_vision_transformers-{keras_vit.__version__}-py3-none-any.whl"
    metadata = email.message_from_string(_dist_info(wheel, "METADATA"))
    assert metadata["Name"] == DISTRIBUTION
    assert metadata["Version"] == keras_vit.__version__
    assert "tensorflow>=2.20" in metadata.get_all("Requires-Dist")


def test_the_wheel_installs_the_keras_vit_command_and_nothing_but_its_own_modules(wheel):
    entry_points = _dist_info(wheel, "entry_points.txt")
    assert "[console_scripts]\nkeras-vit = keras_vit_cli:main" in entry_points
    _, files, _ = wheel
    top_level = {name.split("/")[0] for name in files if ".dist-info/" not in name}
    assert top_level == {"keras_vit", "keras_vit_cli.py"}  # no tests, benchmarks, scripts or `export`
    assert not [name for name in files if "__pycache__" in name or "node_modules" in name]


def test_every_module_of_the_library_the_exporter_and_the_apps_is_in_the_wheel(wheel):
    _, files, _ = wheel
    modules = [p for folder in INSTALLED_AS for p in _source_files(folder, "*.py")]
    assert len(modules) > 80
    assert [_in_wheel(p) for p in modules if _in_wheel(p) not in files] == []


def test_the_package_data_is_in_the_wheel_byte_for_byte(wheel):
    """The apps' web files and the mobile app's npm lock, the embedded cifar10-mini and the
    model tables (pretrained tags, ImageNet labels); the embedded model wherever the tree has it."""
    _, files, archive = wheel
    data = [
        *_source_files("apps/mobile/web"),
        ROOT / "apps/mobile/package.json",
        ROOT / "apps/mobile/package-lock.json",
        *_source_files("keras_vit/data/embedded", "*.zip"),
        *_source_files("keras_vit/data/embedded", "*.md"),
        *_source_files("keras_vit/model/tables"),
    ]
    embedded_model = _source_files("keras_vit/model/embedded")  # weights, config, provenance, licence
    for path in data + embedded_model:
        name = _in_wheel(path)
        assert name in files, f"{name} is missing from the wheel"
        assert archive.read(name) == path.read_bytes(), f"{name} differs from {path}"
    assert {"keras_vit/apps/mobile/web/index.html", "keras_vit/data/embedded/cifar10_mini.zip"} <= set(files)
    assert "keras_vit/model/tables/imagenet-1k.tsv.gz" in files


def test_the_phone_apps_front_end_ships_in_the_wheel_at_the_locked_versions(wheel, tmp_path):
    """Serving the app from an installed wheel needs no npm: the wheel's vendor/ is a complete
    front end (every file the page loads, every package at the version package-lock.json pins)."""
    _, files, archive = wheel
    prefix = "keras_vit/apps/mobile/vendor/"
    shipped = sorted(name.removeprefix(prefix) for name in files if name.startswith(prefix))
    packages = [f"{package}/package.json" for package in front_end.locked_versions()]
    assert shipped == sorted([*front_end.VENDOR_FILES, *packages])  # those files, and no others
    assert any(name.endswith(".wasm") for name in shipped)
    archive.extractall(tmp_path, [prefix + name for name in shipped])
    assert front_end.holds_front_end(tmp_path / prefix)


def test_the_embedded_model_is_in_the_wheel_when_the_tree_has_it(wheel):
    weights = _source_files("keras_vit/model/embedded", "*.safetensors")
    if not weights:
        pytest.skip("keras_vit/model/embedded/ has no .safetensors yet")
    _, files, _ = wheel
    for path in weights:
        assert files[_in_wheel(path)].file_size == path.stat().st_size
