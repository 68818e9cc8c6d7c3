"""The Swin Transformer family against timm and transformers: names and counts, logits through the
stand-in hub (timm repos, Microsoft's original layout, transformers' Swin), another image size
and window, the stage feature maps, and a `.keras` round trip. Tiny random configs made by those
libraries here (a few blocks, width 24), every weight perturbed so that no swapped pair of
weights goes unseen."""

import json
import os
import re
import shutil

import numpy as np
import pytest
import timm
import torch
from conftest import HUB
from timm.models import save_for_hf
from timm_reference import on_meta
from torch.utils.flop_counter import FlopCounterMode

import keras_vit
from keras_vit.model import complexity, registry

TINY = dict(embed_dim=24, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))
# (timm name, timm's arguments, image size): window 7 at 224; a 256 grid the window-7 blocks pad
# (64x64 patches); window 12 at 384; Swin-S3's window per stage.
CASES = {
    "window7": ("swin_tiny_patch4_window7_224", dict(TINY), 224),
    "padded": ("swin_tiny_patch4_window7_224", dict(TINY, img_size=256), 256),
    "window12": ("swin_base_patch4_window12_384", dict(TINY, depths=(1, 1, 2, 1)), 384),
    "per-stage": ("swin_s3_tiny_224", dict(TINY), 224),
}


def _perturbed(model, seed=0):
    """`model` with every weight moved by a seeded normal(0, 0.05): LayerNorm scales off 1 and
    biases off 0, so a mapping that swaps them fails."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model.eval()


def _timm_swin(name, arguments, num_classes=5, seed=0):
    torch.manual_seed(seed)
    return _perturbed(timm.create_model(name, pretrained=False, num_classes=num_classes, **arguments), seed)


def _pixels(size, seed=0, count=2):
    return np.random.default_rng(seed).uniform(0, 255, (count, size, size, 3)).astype("float32")


def _timm_logits(model, pixels):
    config = model.pretrained_cfg
    x = (pixels / 255 - np.array(config["mean"])) / np.array(config["std"])
    with torch.no_grad():
        return model(torch.from_numpy(x.transpose(0, 3, 1, 2)).float()).numpy()


def _publish(repo, model):
    folder = HUB.repo_folder(repo)
    shutil.rmtree(folder, ignore_errors=True)
    save_for_hf(model, folder, safe_serialization=True)
    return folder


def test_every_named_swin_has_timms_parameter_count_and_a_tiny_ones_flops_are_timms():
    names = [name for name in keras_vit.list_models() if registry.family_named(name).name == "swin"]
    assert {"swin_tiny_patch4_window7_224", "swin_base_patch4_window12_384", "swin_s3_tiny_224"} <= set(names)
    for name in names:
        reference = on_meta(name)
        assert complexity.parameter_count(name) == sum(p.numel() for p in reference.parameters()), name
    # FLOPs as PyTorch counts them (2 per multiply-accumulate), padded windows included.
    reference = timm.create_model("swin_tiny_patch4_window7_224", num_classes=7, **CASES["padded"][1]).eval()
    with FlopCounterMode(display=False) as counter:
        reference(torch.zeros(1, 3, 256, 256))
    ours = complexity.forward_flops("swin_tiny_patch4_window7_224", num_classes=7, image_size=256, **TINY)
    assert ours == counter.get_total_flops()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_timm_swin_repo_gives_timms_logits(case, hub_cache, record_parity):
    name, arguments, size = CASES[case]
    reference = _timm_swin(name, arguments)
    _publish(f"tests/swin-{case}", reference)
    model = keras_vit.create_model(f"hf-hub:tests/swin-{case}", pretrained=True)
    assert model.family == "swin" and model.image_size == (size, size)
    pixels = _pixels(size)
    difference = np.abs(np.asarray(model(pixels)) - _timm_logits(reference, pixels)).max()
    record_parity(f"timm Swin repo, tiny {name} ({case}, {size} px) logits", difference, 1e-4)
    assert difference < 1e-4


def test_another_image_size_and_window_give_timms_logits(hub_cache, record_parity):
    """`create_model(name, pretrained=True, image_size=S, window_size=W)` is timm's
    `create_model(name, pretrained=True, img_size=S, window_size=W)`: the bias tables resized
    from window 7 to 8 as timm resizes them, on a grid of 64 that window 8 tiles."""
    _publish("tests/swin-resized", _timm_swin("swin_tiny_patch4_window7_224", TINY))
    by_timm = timm.create_model(
        "hf-hub:tests/swin-resized", pretrained=True, img_size=256, window_size=8
    ).eval()
    model = keras_vit.create_model(
        "hf-hub:tests/swin-resized", pretrained=True, image_size=256, window_size=8
    )
    pixels = _pixels(256, seed=1)
    difference = np.abs(np.asarray(model(pixels)) - _timm_logits(by_timm, pixels)).max()
    record_parity("timm Swin at another size and window (bias tables resized)", difference, 1e-4)
    assert difference < 1e-4


def test_microsofts_original_checkpoint_loads_with_its_downsampling_moved_and_its_buffers_dropped(
    tmp_path, record_parity
):
    reference = _timm_swin("swin_tiny_patch4_window7_224", TINY, num_classes=3)
    original = {}
    for key, value in reference.state_dict().items():
        stage = key.split(".")[1] if key.startswith("layers.") else None
        if stage is not None and ".downsample." in key:  # timm's stage i downsamples at its start
            key = key.replace(f"layers.{stage}.", f"layers.{int(stage) - 1}.")
        original[key.replace("head.fc.", "head.")] = value
    for key in [k for k in original if k.endswith("relative_position_bias_table")]:
        original[key.replace("relative_position_bias_table", "relative_position_index")] = torch.zeros(49, 49)
    path = tmp_path / "swin_tiny_patch4_window7_224.pth"
    torch.save({"model": original}, path)
    model = keras_vit.create_model("swin_tiny_patch4_window7_224", num_classes=3, **TINY)
    keras_vit.load_weights(model, path)
    x = np.random.default_rng(2).normal(size=(2, 224, 224, 3)).astype("float32")
    with torch.no_grad():
        expected = reference(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()
    difference = np.abs(np.asarray(model(x)) - expected).max()
    record_parity("Microsoft's original Swin checkpoint, tiny, logits", difference, 1e-4)
    assert difference < 1e-4


def test_a_transformers_swin_repo_gives_transformers_logits_and_labels(hub_cache, record_parity):
    transformers = pytest.importorskip("transformers")
    config = transformers.SwinConfig(
        image_size=224, patch_size=4, embed_dim=24, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4],
        window_size=7, id2label=dict(enumerate(["cat", "dog", "fox"])),
    )  # fmt: skip
    reference = _perturbed(transformers.SwinForImageClassification(config), seed=3)
    folder = HUB.repo_folder("tests/swin-transformers")
    shutil.rmtree(folder, ignore_errors=True)
    reference.save_pretrained(folder)
    transformers.ViTImageProcessor(image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.25, 0.3]).save_pretrained(
        folder
    )
    model = keras_vit.create_model("hf-hub:tests/swin-transformers", pretrained=True)
    assert model.family == "swin" and model.class_names == ["cat", "dog", "fox"]
    pixels = _pixels(224, seed=3)
    x = (pixels / 255 - np.array([0.4, 0.5, 0.6])) / np.array([0.2, 0.25, 0.3])
    with torch.no_grad():
        expected = reference(torch.from_numpy(x.transpose(0, 3, 1, 2)).float()).logits.numpy()
    difference = np.abs(np.asarray(model(pixels)) - expected).max()
    record_parity("transformers Swin repo, tiny, logits", difference, 1e-4)
    assert difference < 1e-4


def test_features_are_timms_four_stage_maps_channels_last(record_parity):
    reference = _timm_swin("swin_tiny_patch4_window7_224", TINY)
    features = timm.create_model(
        "swin_tiny_patch4_window7_224", pretrained=False, features_only=True, **TINY
    ).eval()
    # timm's FeatureListNet flattens `layers.i` to `layers_i`.
    state = {re.sub(r"^layers\.(\d+)", r"layers_\1", k): v for k, v in reference.state_dict().items()}
    features.load_state_dict({k: v for k, v in state.items() if not k.startswith(("head", "norm"))})
    model = keras_vit.create_model("swin_tiny_patch4_window7_224", num_classes=5, **TINY)
    keras_vit.load_weights(model, _saved(reference))
    x = np.random.default_rng(4).normal(size=(1, 224, 224, 3)).astype("float32")
    with torch.no_grad():
        expected = [m.numpy() for m in features(torch.from_numpy(x.transpose(0, 3, 1, 2)))]
    maps = keras_vit.features.intermediates(model, x)
    widths = [24, 48, 96, 192]
    assert [tuple(m.shape) for m in maps] == [(1, 56 >> s, 56 >> s, w) for s, w in enumerate(widths)]
    for ours, theirs in zip(maps, expected, strict=True):
        theirs = theirs if theirs.shape[-1] == ours.shape[-1] else theirs.transpose(0, 2, 3, 1)
        difference = np.abs(np.asarray(ours) - theirs).max()
        assert difference < 1e-4
    record_parity("timm Swin features_only, four stage maps", difference, 1e-4)
    named = keras_vit.features.features_model(model, indices=[1, 3])(x)
    np.testing.assert_allclose(np.asarray(named["stage_3"]), np.asarray(maps[3]), atol=1e-6)


def _saved(reference):
    import tempfile

    from safetensors.torch import save_file

    path = os.path.join(tempfile.mkdtemp(prefix="keras-vit-swin-"), "swin.safetensors")
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, path)
    return path


def test_a_swin_survives_a_keras_round_trip_and_says_what_it_cannot_be(tmp_path):
    import keras

    model = keras_vit.create_model(
        "swin_tiny_patch4_window7_224",
        image_size=64,
        num_classes=3,
        window_size=4,
        **TINY,
        drop_path_rate=0.1,
    )
    x = np.random.default_rng(5).uniform(0, 255, (2, 64, 64, 3)).astype("float32")
    model.save(tmp_path / "swin.keras")
    loaded = keras.models.load_model(tmp_path / "swin.keras")
    assert loaded.family == "swin" and loaded.window_size == (4, 4, 4, 4)
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model(x)), atol=1e-6)
    from keras_vit.layers import PatchMerging, SwinBlock, WindowAttention  # the public path

    assert {type(layer) for layer in loaded.layers} >= {PatchMerging, SwinBlock}
    assert isinstance(loaded.get_layer("stage_0_block_1").attention, WindowAttention)
    with pytest.raises(ValueError, match="nearest sizes that work are 60 or 64"):
        keras_vit.create_model("swin_tiny_patch4_window7_224", image_size=62)
    with pytest.raises(TypeError, match="unknown argument"):
        keras_vit.create_model("swin_tiny_patch4_window7_224", hidden_dim=3)


def test_a_swin_by_timms_tag_loads_from_the_hub_and_predicts_imagenet_names(hub_cache, tmp_path, capsys):
    """`swin_tiny_patch4_window7_224.ms_in1k` resolves to timm's repo of that name (here, the
    stand-in serving a tiny Swin under it), and `keras-vit predict` names ImageNet's classes."""
    from PIL import Image

    from keras_vit.cli import main

    reference = _timm_swin("swin_tiny_patch4_window7_224", TINY, num_classes=1000)
    _publish("timm/swin_tiny_patch4_window7_224.ms_in1k", reference)
    model = keras_vit.create_model("swin_tiny_patch4_window7_224.ms_in1k", pretrained=True)
    assert model.family == "swin" and model.class_names[0] == "tench, Tinca tinca"
    by_timm = timm.create_model("hf-hub:timm/swin_tiny_patch4_window7_224.ms_in1k", pretrained=True).eval()
    pixels = _pixels(224, seed=6)
    assert np.abs(np.asarray(model(pixels)) - _timm_logits(by_timm, pixels)).max() < 1e-4
    photo = tmp_path / "photo.png"
    Image.fromarray(pixels[0].astype("uint8")).save(photo)
    assert main(["predict", "swin_tiny_patch4_window7_224.ms_in1k", str(photo), "--json"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)  # read with the repo's crop and bicubic resize
    ranked = answer["top_k"]
    assert len(ranked) == 5 and all(p["class"] in model.class_names for p in ranked)
    assert ranked[0]["probability"] == max(p["probability"] for p in ranked)


def test_resizing_a_swin_resizes_each_bias_table_from_its_own_window():
    """At 64x48 the third stage's 4x3 grid is one 4x3 window (a non-square table); at 64x64 it
    is 4x4. Each table is resized from its block's window, the unchanged ones kept as they are."""
    model = keras_vit.create_model(
        "swin_tiny_patch4_window7_224", image_size=(64, 48), num_classes=3, **TINY, drop_path_rate=0.0
    )
    resized = keras_vit.resize_model(model, 64)
    assert model.get_layer("stage_2_block_0").effective_window == (4, 3)
    assert resized.get_layer("stage_2_block_0").effective_window == (4, 4)
    kept = model.get_layer("stage_0_block_0").attention.relative_position_bias_table
    np.testing.assert_array_equal(
        np.asarray(resized.get_layer("stage_0_block_0").attention.relative_position_bias_table),
        np.asarray(kept),
    )
    assert np.isfinite(np.asarray(resized(_pixels(64)))).all()
