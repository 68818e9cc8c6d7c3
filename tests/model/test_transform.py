"""`keras_vit.model.transform`: timm's evaluation transform, its geometry and its ports."""

import numpy as np
import pytest
import tensorflow as tf
import timm
import timm.data
from PIL import Image

from keras_vit.data import images, pipeline
from keras_vit.model.transform import Transform


@pytest.mark.parametrize(
    "transform",
    [Transform(0.9, "center", "bicubic"), Transform(0.875, "squash", "bilinear"), Transform()],
    ids=["vit", "squash", "plain"],
)
@pytest.mark.parametrize("size", [(224, 224), (200, 300), (250, 333), (57, 40)])
def test_a_photo_is_read_as_timms_evaluation_transform_reads_it(transform, size):
    """The pixels timm's own `create_transform` gives (Pillow's resize, torchvision's crop), to the
    bit, where Pillow filters the width first as keras-vit does (it starts with the height on
    some shrinks, and then differs by a step at some pixels)."""
    pixels = np.random.default_rng(sum(size)).integers(0, 256, size + (3,), dtype=np.uint8)
    timms = timm.data.create_transform(
        (3, 224, 224),
        crop_pct=transform.crop_pct,
        crop_mode=transform.crop_mode,
        interpolation=transform.interpolation,
        mean=(0, 0, 0),
        std=(1, 1, 1),
    )
    expected = np.round(timms(Image.fromarray(pixels)).numpy().transpose(1, 2, 0) * 255)
    np.testing.assert_array_equal(images.resize(pixels, (224, 224), transform), expected)


def test_the_plan_is_the_same_in_tensor_ops_for_any_photo_size():
    """The served SavedModel learns a photo's size only when it reads it."""
    rng = np.random.default_rng(0)
    sizes = [(224, 224), (1, 1), (1, 500), (3000, 7)] + [tuple(rng.integers(1, 1200, 2)) for _ in range(40)]
    for transform in (
        Transform(0.9, "center", "bicubic"),
        Transform(0.875, "squash"),
        Transform(0.8, "center"),
    ):
        for image_size in ((224, 224), (24, 40)):
            for size in sizes:
                resized, corner = pipeline.plan(tf.constant(size), image_size, transform)
                found = tuple(int(v) for v in resized), tuple(int(v) for v in corner)
                assert found == transform.plan(size, image_size), (transform, image_size, size)


def test_the_tensorflow_port_is_the_numpy_one_to_the_bit_at_any_size():
    rng = np.random.default_rng(1)
    for transform in (Transform(0.9, "center", "bicubic"), Transform(0.875, "squash"), Transform()):
        for size in ((24, 40), (300, 31), (17, 90), (1100, 700)):
            pixels = rng.integers(0, 256, size + (3,), dtype=np.uint8)
            unknown_size = tf.function(
                lambda image, transform=transform: pipeline.resize(image, (24, 40), transform),
                input_signature=[tf.TensorSpec((None, None, 3), tf.uint8)],
            )
            expected = images.resize(pixels, (24, 40), transform)
            np.testing.assert_array_equal(unknown_size(tf.constant(pixels)).numpy(), expected)
            np.testing.assert_array_equal(pipeline.resize(tf.constant(pixels), (24, 40), transform), expected)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(crop_pct=0), "crop_pct must be a number in \\(0, 1\\]"),
        (dict(crop_pct=1.2), "crop_pct must be a number in \\(0, 1\\]"),
        (dict(crop_mode="border"), "crop_mode 'border' is not one keras-vit applies: use center or squash"),
        (dict(interpolation="lanczos"), "interpolation 'lanczos' is not one keras-vit applies"),
    ],
)
def test_a_transform_keras_vit_cannot_apply_is_refused_by_name(arguments, message):
    with pytest.raises(ValueError, match=message):
        Transform(**arguments)


@pytest.mark.parametrize(
    "preprocessor, expected",
    [
        ({}, (1.0, "squash", "bilinear")),  # ViTImageProcessor's defaults: 224x224, bilinear, no crop
        (  # DeiTImageProcessor's: 256x256 bicubic, then the centre 224x224
            {"size": {"height": 256, "width": 256}, "resample": 3, "do_center_crop": True,
             "crop_size": {"height": 224, "width": 224}},
            (0.875, "squash", "bicubic"),
        ),
        (  # the shortest edge to 256, then the centre 224x224 (ConvNeXt-style processors)
            {"size": {"shortest_edge": 256}, "resample": 3, "do_center_crop": True,
             "crop_size": {"height": 224, "width": 224}},
            (0.875, "center", "bicubic"),
        ),
    ],
)  # fmt: skip
def test_a_transformers_image_processor_is_read_as_its_transform(preprocessor, expected):
    from keras_vit.model.hub_config import read_config
    from keras_vit.model.registry import FAMILIES

    config = {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 64, "architectures": ["ViTModel"]}  # fmt: skip
    found = read_config(config, "tests/any", FAMILIES.values(), preprocessor)
    assert tuple(found.arguments[name] for name in ("crop_pct", "crop_mode", "interpolation")) == expected


def test_a_timm_config_without_a_transform_gets_timms_defaults():
    """timm's `resolve_data_config`: crop_pct 0.875, centre crop, bicubic where a config says nothing."""
    from keras_vit.model.hub_config import read_config
    from keras_vit.model.registry import FAMILIES

    found = read_config(
        {"architecture": "vit_tiny_patch16_224", "num_classes": 0}, "tests/any", FAMILIES.values()
    )
    timms = timm.data.resolve_data_config({}, pretrained_cfg={"input_size": (3, 224, 224)})
    assert [found.arguments[name] for name in ("crop_pct", "crop_mode", "interpolation")] == [
        timms["crop_pct"],
        timms["crop_mode"],
        timms["interpolation"],
    ]
