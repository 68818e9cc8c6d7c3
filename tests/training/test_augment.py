"""The batch augmentation that runs inside the training step (keras_vit.training.augment)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit.training.augment import (
    BatchAugmentation,
    PerImageRandAugment,
    pad_and_crop,
    random_resized_crop,
)

RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, (6, 16, 16, 3)).astype("float32")
LABELS = np.eye(4, dtype="float32")[[0, 1, 2, 3, 0, 1]]


def _graph(layer):
    """The layer as the training step runs it: inside a compiled graph."""
    return tf.function(lambda images, labels: layer(images, labels, training=True))


def test_a_step_repeats_its_draws_and_the_next_step_draws_anew():
    layer = BatchAugmentation(crop="resized", randaugment_ops=2, mixup=0.8, cutmix=1.0, erasing=0.5, seed=3)
    step = _graph(layer)
    first = [t.numpy() for t in step(IMAGES, LABELS)]
    second = [t.numpy() for t in step(IMAGES, LABELS)]
    assert int(layer.step.numpy()) == 2
    layer.step.assign(0)  # as a restored backup sets it
    replay = [t.numpy() for t in step(IMAGES, LABELS)]
    np.testing.assert_array_equal(first[0], replay[0])
    np.testing.assert_array_equal(first[1], replay[1])
    assert not np.array_equal(first[0], second[0])
    other = BatchAugmentation(crop="resized", randaugment_ops=2, mixup=0.8, cutmix=1.0, erasing=0.5, seed=4)
    assert not np.array_equal(first[0], _graph(other)(IMAGES, LABELS)[0].numpy())
    for images, labels in (first, second):
        assert images.shape == IMAGES.shape and 0 <= images.min() and images.max() <= 255
        np.testing.assert_allclose(labels.sum(axis=1), 1.0, atol=1e-5)  # mixed labels stay a distribution


def test_inference_and_an_empty_recipe_change_nothing():
    layer = BatchAugmentation(crop="pad", randaugment_ops=2, mixup=0.8, seed=0)
    images, labels = layer(IMAGES, LABELS, training=False)
    np.testing.assert_array_equal(images, IMAGES)
    idle = BatchAugmentation(crop="none", flip=False)
    assert not idle.active
    np.testing.assert_array_equal(idle(IMAGES, LABELS, training=True)[0], IMAGES)


def test_pad_and_crop_shifts_each_image_by_at_most_an_eighth_with_reflection():
    out = keras.ops.convert_to_numpy(pad_and_crop(IMAGES, keras.random.SeedGenerator(1)))
    padded = np.pad(IMAGES, ((0, 0), (2, 2), (2, 2), (0, 0)), mode="reflect")
    shifts = []
    for image, result in zip(padded, out, strict=True):
        matches = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if np.array_equal(image[dy : dy + 16, dx : dx + 16], result)
        ]
        assert matches, "not a reflected shift of the image"
        shifts.append(matches[0])
    assert len(set(shifts)) > 1  # each image draws its own shift


def test_random_resized_crop_interpolates_inside_the_image():
    flat = np.full((4, 16, 16, 3), 77.0, np.float32)
    out = keras.ops.convert_to_numpy(random_resized_crop(flat, keras.random.SeedGenerator(0)))
    np.testing.assert_allclose(out, 77.0, rtol=1e-5)  # interpolation weights sum to one
    ramp = np.broadcast_to(np.arange(16, dtype=np.float32)[None, :, None, None], (4, 16, 16, 3))
    cropped = keras.ops.convert_to_numpy(random_resized_crop(ramp, keras.random.SeedGenerator(0), 0.2))
    rows = cropped[:, :, 0, 0]
    assert (np.diff(rows, axis=1) >= -1e-4).all()  # order kept: a crop, not a shuffle
    assert (rows[:, -1] - rows[:, 0] < 15).any()  # and some crops zoom in


def test_the_layer_saves_its_config_and_refuses_bad_settings():
    layer = BatchAugmentation(
        crop="resized", min_scale=0.35, randaugment_ops=2, cutmix=1.0, erasing=0.25, seed=7
    )
    copy = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert copy.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="crop must be one of"):
        BatchAugmentation(crop="center")
    with pytest.raises(ValueError, match="erasing is a probability"):
        BatchAugmentation(erasing=1.5)
    with pytest.raises(ValueError, match="mixup must not be negative"):
        BatchAugmentation(mixup=-1)


def test_randaugment_draws_its_operations_for_each_image():
    """Each image gets the operation drawn for it: its row of the per-image draw, applied by
    the Keras layer of that operation (Keras itself draws one operation for the whole batch)."""
    layer = PerImageRandAugment(value_range=(0, 255), num_ops=1, factor=0.8, seed=1)
    images = RNG.integers(0, 256, (32, 16, 16, 3)).astype("float32")
    transformation = layer.get_random_transformation(images, training=True)
    chosen = keras.ops.convert_to_numpy(transformation["layer_idxes"])
    assert chosen.shape == (32, 1) and len(np.unique(chosen)) > 3
    augmented = keras.ops.convert_to_numpy(layer.transform_images(images, transformation))
    names = list(transformation["transforms"])
    for j in range(len(images)):
        name = names[chosen[j, 0]]
        expected = getattr(layer, name).transform_images(images, transformation["transforms"][name])
        np.testing.assert_allclose(augmented[j], keras.ops.convert_to_numpy(expected)[j], atol=1e-4)
