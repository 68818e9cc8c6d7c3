"""Tiny random timm references served by the stand-in hub, each built once per kind.

test_timm_kinds.py and test_eva.py compare keras-vit with timm on one tiny instance of each kind:
timm builds it from a real tag's entry point, `save_for_hf` writes it under `timm/<tag>` (the
stand-in hub serves it as `hf-hub:timm/<tag>`), and keras-vit loads it. `reference_kind` does that
once per kind and keeps keras-vit's model at the tag's own size, so a file's tests of one kind
(outputs, round trip, features, publishing) share the objects instead of rebuilding them.
"""

import contextlib
import os
import shutil
import unittest.mock

import numpy as np
import timm
import torch
from conftest import HUB
from timm.models import save_for_hf

import keras_vit

# Tiny: 2 blocks of width 64, 2 heads.
SMALL = dict(depth=2, embed_dim=64, num_heads=2)


def on_meta(name, **kwargs):
    """timm's model `name` on PyTorch's meta device: shapes only, even a 7B. Its weights are not
    initialised: initialising is most of what building one costs, even on meta (ViT-H/14 0.43 s,
    0.05 s skipped). Where the model class takes `weight_init="skip"` (ViT, DeiT, the relpos
    ViTs, Swin) by that; an Eva, which does not, with timm's truncated normal left out (EVA02-L
    0.76 s)."""
    with torch.device("meta"):
        try:
            return timm.create_model(name, pretrained=False, weight_init="skip", **kwargs)
        except TypeError:  # a class without the argument
            with unittest.mock.patch("timm.layers.weight_init._trunc_normal_", lambda tensor, *_: tensor):
                return timm.create_model(name, pretrained=False, **kwargs)


def pixels(size, seed=0):
    """Two random [0, 255] images of `size` (a side, or (height, width))."""
    height, width = (size, size) if isinstance(size, int) else size
    return np.random.default_rng(seed).uniform(0, 255, (2, height, width, 3)).astype("float32")


def timm_outputs(model, images):
    """timm's outputs for [0, 255] pixels, normalised as its pretrained_cfg says."""
    config = model.pretrained_cfg
    x = (images / 255 - np.array(config["mean"])) / np.array(config["std"])
    with torch.no_grad():
        return model.eval()(torch.from_numpy(x.transpose(0, 3, 1, 2)).float()).numpy()


def largest_difference(model, by_timm, images):
    """The largest difference between keras-vit's `model` and timm's `by_timm` on `images`."""
    outputs, expected = np.asarray(model(images)), timm_outputs(by_timm, images)
    assert outputs.shape == expected.shape
    return np.abs(outputs - expected).max()


@contextlib.contextmanager
def hub_cache_at(folder):
    """An empty huggingface_hub cache in `folder` while the block runs (as conftest's `hub_cache`,
    for fixtures wider than one test): a repo rewritten under the same id is downloaded again."""
    from huggingface_hub import constants

    previous = constants.HF_HUB_CACHE, os.environ.get("HF_HUB_CACHE")
    constants.HF_HUB_CACHE = os.environ["HF_HUB_CACHE"] = str(folder)
    try:
        yield folder
    finally:
        constants.HF_HUB_CACHE = previous[0]
        if previous[1] is None:
            os.environ.pop("HF_HUB_CACHE", None)
        else:
            os.environ["HF_HUB_CACHE"] = previous[1]


class ReferenceKind:
    """One kind: its name, timm tag, model_args, another image size, timm's tiny model (`reference`)
    and keras-vit's model of the served repo at the tag's size (`model`, loaded once)."""

    def __init__(self, name, tag, model_args, other_size, reference, model):
        self.name, self.tag, self.model_args, self.other_size = name, tag, model_args, other_size
        self.reference, self.model = reference, model

    @property
    def size(self):
        """The tag's image size: a side, or (height, width) where they differ."""
        height, width = self.reference.pretrained_cfg["input_size"][1:]
        return height if height == width else (height, width)

    @property
    def hub_name(self):
        return f"hf-hub:timm/{self.tag}"

    def models_at(self, image_size):
        """(timm's model, keras-vit's model) of the served repo at `image_size`, each library
        resizing the position embeddings its own way; keras-vit's at the tag's size is `model`."""
        by_timm = timm.create_model(self.hub_name, pretrained=True, img_size=image_size)
        if image_size == self.size:
            return by_timm, self.model
        return by_timm, keras_vit.create_model(self.hub_name, pretrained=True, image_size=image_size)


def reference_kind(entry, randomize, cache_folder):
    """`entry` is a kinds table's row (kind, timm tag, model_args beyond SMALL, another size).
    timm's tiny model of the tag (seed 0; `randomize(model)` then sets what the file wants to see
    in the outputs) is written to the stand-in hub as `timm/<tag>`, and keras-vit loads it through
    a fresh cache in `cache_folder`."""
    name, tag, extra, other_size = entry
    model_args = dict(SMALL, **extra)
    torch.manual_seed(0)
    reference = timm.create_model(tag, pretrained=False, **model_args)
    with torch.no_grad():
        randomize(reference)
    folder = HUB.repo_folder(f"timm/{tag}")
    shutil.rmtree(folder, ignore_errors=True)
    save_for_hf(reference, folder, model_args=model_args)
    with hub_cache_at(cache_folder):
        model = keras_vit.create_model(f"hf-hub:timm/{tag}", pretrained=True)
    return ReferenceKind(name, tag, model_args, other_size, reference.eval(), model)
