"""The public API the README and the docs pages document: every `keras_vit.x.y` path they show
resolves, as an import of the longest module prefix and attributes after it (so `from
keras_vit.layers import PatchEncoder` works, not just `keras_vit.layers.PatchEncoder`), and the
top-level namespace holds the public names only."""

import importlib
import os
import re
import types

from test_readme import ROOT, pages

import keras_vit


def _documented_paths():
    text = "\n".join(open(os.path.join(ROOT, page), encoding="utf-8").read() for page in pages())
    return sorted(set(re.findall(r"keras_vit(?:\.[A-Za-z_][A-Za-z_0-9]*)+", text)))


def _resolve(path):
    """(the longest importable module prefix, the object the whole path names)."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        value = module
        for name in parts[end:]:
            value = getattr(value, name)
        return ".".join(parts[:end]), value
    raise AssertionError(f"{path}: no part of it imports")


def test_every_path_the_pages_show_resolves_and_its_modules_import_by_name():
    paths = _documented_paths()
    assert len(paths) > 15, paths  # the pages document the API; a parse that finds nothing is broken
    for path in paths:
        module, value = _resolve(path)
        assert value is not None, path
        if path.count(".") >= 2 or module != "keras_vit":
            # A documented `keras_vit.x.Name`: `from keras_vit.x import Name` must work too.
            parent, _, name = path.rpartition(".")
            exec(f"from {parent} import {name}", {})


def test_the_public_modules_import_directly():
    from keras_vit.features import features_model, intermediates  # noqa: F401
    from keras_vit.layers import PatchEncoder, SwinBlock  # noqa: F401
    from keras_vit.optimizers import AdamW  # noqa: F401
    from keras_vit.pipeline import read_training_data  # noqa: F401

    assert keras_vit.layers.PatchEncoder is PatchEncoder


def test_the_top_level_namespace_is_the_public_api():
    """Public names only: besides `__all__`, just the package's own submodules, which Python
    sets on the package as they are imported."""
    others = {
        name
        for name, value in vars(keras_vit).items()
        if not name.startswith("_")
        and name not in keras_vit.__all__
        and not (isinstance(value, types.ModuleType) and value.__name__ == f"keras_vit.{name}")
    }
    assert others == set(), others
    for leaked in ("os", "sys", "importlib"):
        assert leaked not in vars(keras_vit), leaked
