import numpy as np
import pytest
import tensorflow as tf
from conftest import encoded_in_every_format

from keras_vit.data import pipeline
from keras_vit.data.contract import InputContract
from keras_vit.model.transform import Transform


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
    batches = pipeline.training_batches(pairs, image_size=(8, 8), batch_size=32, seed=0)
    seen = np.zeros(12)
    for batch in batches.take(4):
        seen += np.bincount(batch["labels"].numpy(), minlength=12)
        assert batch["images"].shape == (32, 8, 8, 3) and batch["images"].dtype == tf.uint8
    assert (seen > 0).all(), seen


def _passes(dataset, batches_per_pass, count=2):
    """The labels of the stream's first `count` passes, one array each."""
    labels = [batch["labels"].numpy() for batch in dataset.take(batches_per_pass * count)]
    return [np.concatenate(labels[i : i + batches_per_pass]) for i in range(0, len(labels), batches_per_pass)]


def test_training_batches_reshuffle_each_pass_repeatably_with_either_cache(monkeypatch):
    """Small datasets keep decoded uint8 images in memory; big ones keep the encoded files."""
    pairs = _sorted_by_class(per_class=40)  # 160 images: 10 batches of 16 a pass

    one, two = _passes(pipeline.training_batches(pairs, image_size=(8, 8), batch_size=16, seed=1), 10)
    assert sorted(one) == sorted(two) and not np.array_equal(one, two)  # reshuffled, same images
    again = _passes(pipeline.training_batches(pairs, image_size=(8, 8), batch_size=16, seed=1), 10)
    np.testing.assert_array_equal(np.concatenate([one, two]), np.concatenate(again))  # a seed repeats
    other = _passes(pipeline.training_batches(pairs, image_size=(8, 8), batch_size=16, seed=2), 10)
    assert not np.array_equal(one, other[0])
    tf.random.set_seed(0)  # as keras.utils.set_random_seed(0) does: the order is the run seed's alone
    try:
        zero = _passes(pipeline.training_batches(pairs, image_size=(8, 8), batch_size=16, seed=1), 10)
    finally:
        tf.random.set_seed(None)
    np.testing.assert_array_equal(np.concatenate([one, two]), np.concatenate(zero))
    monkeypatch.setattr(pipeline, "DECODED_CACHE_BYTES", 100)  # too small: encoded cache
    big = _passes(pipeline.training_batches(pairs, image_size=(8, 8), batch_size=16, seed=1), 10)
    np.testing.assert_array_equal(np.concatenate([one, two]), np.concatenate(big))  # the same order


def test_a_stream_started_at_a_batch_is_the_whole_streams_tail_with_either_cache_and_repeats(monkeypatch):
    """A resumed run starts the stream at its step: it must see the batches it would have seen.
    Distinct images (label = index); 60 of them, batches of 12 with 3 copies of each image."""
    images = [tf.io.encode_png(np.full((8, 8, 3), i, np.uint8)).numpy() for i in range(61)]
    pairs = tf.data.Dataset.from_tensor_slices((images, list(range(61))))  # 61: a pass drops one
    # The decoded cache with and without repeats, the encoded one with them. 5 batches a pass:
    # a pass's last batch, the next pass's first, mid-pass in the third.
    decoded = pipeline.DECODED_CACHE_BYTES
    for cache_bytes, repeats in ((decoded, 1), (decoded, 3), (100, 3)):
        monkeypatch.setattr(pipeline, "DECODED_CACHE_BYTES", cache_bytes)
        settings = dict(image_size=(8, 8), batch_size=12, seed=4, repeats=repeats)
        whole = [b["labels"].numpy() for b in pipeline.training_batches(pairs, **settings).take(13)]
        for start in (4, 5, 12):
            tail = pipeline.training_batches(pairs, start_batch=start, **settings).take(13 - start)
            np.testing.assert_array_equal(np.stack([b["labels"].numpy() for b in tail]), whole[start:])


def test_a_dataset_smaller_than_a_batch_is_a_clear_error():
    pairs = _sorted_by_class(classes=1, per_class=5)
    with pytest.raises(ValueError, match="5 images make no batch of 8"):
        pipeline.training_batches(pairs, image_size=(8, 8), batch_size=8)


def test_training_batches_resize_to_uint8_as_evaluation_resizes():
    image = np.random.default_rng(0).integers(0, 256, (20, 12, 3), dtype=np.uint8)
    pairs = tf.data.Dataset.from_tensor_slices(([tf.io.encode_png(image).numpy()] * 2, [0, 1]))
    trained = next(iter(pipeline.training_batches(pairs, image_size=(8, 8), batch_size=2, seed=0)))
    evaluated = next(iter(pipeline.evaluation_batches(pairs, image_size=(8, 8), batch_size=2)))
    assert trained["images"].dtype == tf.uint8 and evaluated["images"].dtype == tf.float32
    np.testing.assert_allclose(trained["images"].numpy()[0], evaluated["images"].numpy()[0], atol=0.5)


def test_evaluation_keeps_order_and_resizes_grayscale_to_rgb():
    gray = [tf.io.encode_png(np.full((10, 6, 1), v, np.uint8)).numpy() for v in (0, 128, 255)]
    pairs = tf.data.Dataset.from_tensor_slices((gray, [0, 1, 2]))
    (batch,) = list(pipeline.evaluation_batches(pairs, image_size=(4, 4), batch_size=8))
    assert batch["images"].shape == (3, 4, 4, 3)
    np.testing.assert_allclose(batch["images"].numpy()[:, 0, 0, 0], [0, 128, 255], atol=1e-3)
    np.testing.assert_array_equal(batch["labels"].numpy(), [0, 1, 2])


def test_repeated_augmentation_puts_each_image_k_times_in_one_batch_and_keeps_the_epoch_length():
    # 60 distinct images (label = index), batches of 12: each batch holds 4 images x 3 copies.
    images = [tf.io.encode_png(np.full((8, 8, 3), i, np.uint8)).numpy() for i in range(60)]
    pairs = tf.data.Dataset.from_tensor_slices((images, list(range(60))))
    batches = pipeline.training_batches(pairs, image_size=(8, 8), batch_size=12, seed=0, repeats=3)
    epochs = [list(labels.reshape(-1, 12)) for labels in _passes(batches, 60 // 12)]
    for epoch in epochs:  # as many steps as without repeats
        for labels in epoch:
            runs = labels.reshape(4, 3)
            assert (runs == runs[:, :1]).all() and len(set(runs[:, 0])) == 4
    first, second = (set(np.concatenate(epoch)) for epoch in epochs)
    assert len(first) == len(second) == 20 and first != second  # a new third of the images each epoch


def test_read_training_data_gives_a_plain_keras_fit_the_images_the_cli_trains_on(colors_dataset):
    """The README's way to train a model of one's own on a folder: `keras_datasets()` are the
    CLI's stream and validation batches as (float32 images, labels) pairs."""
    import keras

    import keras_vit

    data = pipeline.read_training_data(
        colors_dataset, image_size=(32, 32), batch_size=8, validation_split=0.25
    )
    assert data.class_names == ["blue", "green", "red"]
    assert (data.train_count, data.validation_count, data.steps_per_epoch) == (54, 18, 54 // 8)
    train_ds, val_ds = data.keras_datasets()
    (images, labels), batch = next(iter(train_ds)), next(iter(data.train_from(0)))
    assert images.dtype == tf.float32 and images.shape == (8, 32, 32, 3)
    np.testing.assert_array_equal(images.numpy(), batch["images"].numpy().astype(np.float32))
    np.testing.assert_array_equal(labels.numpy(), batch["labels"].numpy())

    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(
        image_size=32, patch_size=8, hidden_dim=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3,
        image_mean=[0.5] * 3, image_std=[0.25] * 3, class_names=data.class_names,
    )  # fmt: skip
    model.compile(
        optimizer=keras.optimizers.AdamW(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(
        train_ds, validation_data=val_ds, steps_per_epoch=data.steps_per_epoch, epochs=4, verbose=0
    )
    assert history.history["val_accuracy"][-1] > 0.9  # three colours are easy


def test_read_training_data_refuses_what_cannot_make_a_batch(colors_dataset):
    with pytest.raises(ValueError, match="54 training images, fewer than one batch of 64"):
        pipeline.read_training_data(colors_dataset, image_size=(32, 32), batch_size=64, validation_split=0.25)


def test_evaluating_a_tflite_reads_a_folders_pixels_as_tf_data_does():
    """`keras-vit evaluate model.tflite` reads folders and `.zip`s with Pillow and NumPy, never
    importing TensorFlow; its images must be the pixels training and the Keras model's
    evaluation see, in the same order."""
    from keras_vit.data.datasets import Split
    from keras_vit.inference.evaluate import _image_batches

    names, encoded = zip(*encoded_in_every_format(), strict=True)
    split = Split(images=encoded, labels=tuple(range(len(encoded))), names=names)
    for transform in (Transform(), Transform(0.9, "center", "bicubic")):  # keras-vit's own, timm's ViT
        contract = InputContract((12, 20), transform=transform)
        by_numpy = np.concatenate(list(_image_batches(split, contract, 3, tensorflow=False)))
        by_tf_data = np.concatenate(list(_image_batches(split, contract, 3, tensorflow=True)))
        assert by_numpy.shape == by_tf_data.shape == (len(names), 12, 20, 3)
        for name, numpy_pixels, tf_pixels in zip(names, by_numpy, by_tf_data, strict=True):
            np.testing.assert_array_equal(numpy_pixels, tf_pixels, err_msg=f"{name}, {transform}")


def test_evaluating_a_tflite_on_a_zip_names_the_member_that_does_not_decode():
    from keras_vit.data.datasets import Split
    from keras_vit.inference.evaluate import _image_batches

    split = Split(images=(b"not an image",), labels=(0,), names=("cats/zz_fake.jpg",))
    with pytest.raises(ValueError, match=r"^cats/zz_fake.jpg: The image is not an image format"):
        list(_image_batches(split, InputContract((8, 8)), 4, tensorflow=False))
