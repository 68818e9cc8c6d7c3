import numpy as np
import tensorflow as tf

from keras_vit import pipeline


def _sorted_by_class(classes=4, per_class=300):
    """Encoded 8x8 PNGs listed class by class, as a folder lists them."""
    images, labels = [], []
    for label in range(classes):
        for i in range(per_class):
            pixels = np.full((8, 8, 3), label * 20 + i % 7, np.uint8)
            images.append(tf.io.encode_png(pixels).numpy())
            labels.append(label)
    return tf.data.Dataset.from_tensor_slices((images, labels))


def test_training_batches_mix_all_classes_even_when_files_are_sorted():
    # 12 classes x 1,000 = 12,000 images, more than a 10,000-image shuffle buffer holds:
    # a partial shuffle would leave the last classes out of the first batches.
    pairs = _sorted_by_class(classes=12, per_class=1000)
    batches = pipeline.make_dataset(
        pairs, image_size=(8, 8), num_classes=12, batch_size=32, training=True, seed=0
    )
    seen = np.zeros(12)
    for images, labels in batches.take(4):
        seen += labels.numpy().sum(axis=0)
        assert images.shape == (32, 8, 8, 3) and images.dtype == tf.float32
    assert (seen > 0).all(), seen


def test_a_seed_makes_the_augmented_stream_repeatable():
    augmentation = pipeline.Augmentation(crop="pad", flip=True, randaugment_ops=2, mixup=0.8, cutmix=1.0)

    def first_batches(seed):
        batches = pipeline.make_dataset(
            _sorted_by_class(per_class=40), image_size=(8, 8), num_classes=4, batch_size=16,
            training=True, augmentation=augmentation, seed=seed,
        )  # fmt: skip
        return [x.numpy() for x, _ in batches.take(2)]

    one, two, other = first_batches(1), first_batches(1), first_batches(2)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(one[0], other[0])


def test_evaluation_keeps_order_and_resizes_grayscale_to_rgb():
    gray = [tf.io.encode_png(np.full((10, 6, 1), v, np.uint8)).numpy() for v in (0, 128, 255)]
    pairs = tf.data.Dataset.from_tensor_slices((gray, [0, 1, 2]))
    (images, labels), *_ = list(
        pipeline.make_dataset(pairs, image_size=(4, 4), num_classes=3, batch_size=8, training=False)
    )
    assert images.shape == (3, 4, 4, 3)
    np.testing.assert_allclose(images.numpy()[:, 0, 0, 0], [0, 128, 255], atol=1e-3)
    np.testing.assert_array_equal(labels.numpy(), np.eye(3))
