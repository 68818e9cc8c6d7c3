"""The tf.data input pipeline: decode, cache, shuffle, augment, resize, batch, prefetch.

Images leave the pipeline as float32 pixel values in [0, 255] at the model's
size; the model normalises them itself (`ViT(image_mean=..., image_std=...)`),
so training, export and the apps share one definition. Labels leave as
one-hot vectors, so MixUp and CutMix can blend them.

Per-image randomness uses stateless ops seeded from a `Dataset.random`
stream, so a seed makes the pipeline repeatable, also in parallel maps.
"""

import dataclasses

import keras
import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """Training-time augmentation.

    Attributes:
        crop: `"resized"` (random resized crop, as Inception and DeiT),
            `"pad"` (pad by 1/8 of the side and crop back, for small images)
            or `"none"`.
        min_scale: smallest crop area, as a fraction, for `"resized"`.
        flip: random horizontal flips.
        randaugment_ops: operations per image for RandAugment; 0 turns it off.
        randaugment_factor: RandAugment's strength, in [0, 1].
        mixup: MixUp's alpha; 0 turns it off.
        cutmix: CutMix's alpha; 0 turns it off. With both on, each batch
            gets one of the two, at random.
    """

    crop: str = "resized"
    min_scale: float = 0.08
    flip: bool = True
    randaugment_ops: int = 0
    randaugment_factor: float = 0.5
    mixup: float = 0.0
    cutmix: float = 0.0

    def __post_init__(self):
        if self.crop not in ("resized", "pad", "none"):
            raise ValueError(f"crop must be 'resized', 'pad' or 'none', got {self.crop!r}.")
        if not 0.0 < self.min_scale <= 1.0:
            raise ValueError(f"min_scale must be in (0, 1], got {self.min_scale}.")
        if self.randaugment_ops < 0 or self.mixup < 0 or self.cutmix < 0:
            raise ValueError("randaugment_ops, mixup and cutmix must not be negative.")


NO_AUGMENTATION = Augmentation(crop="none", flip=False)


def decode_image(encoded, channels=3):
    """Decodes JPEG, PNG, GIF (first frame) or BMP bytes to uint8 `(height, width, channels)`."""
    return tf.io.decode_image(encoded, channels=channels, expand_animations=False)


def resize(image, image_size):
    """Resizes to `image_size` (height, width) as float32 in [0, 255]; skipped when it already fits."""
    image = tf.cast(image, tf.float32)
    if image.shape[0] == image_size[0] and image.shape[1] == image_size[1]:
        return image
    return tf.image.resize(image, image_size, method="bilinear", antialias=True)


def _random_resized_crop(image, seed, min_scale):
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        area_range=(min_scale, 1.0),
        aspect_ratio_range=(3 / 4, 4 / 3),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.slice(image, begin, size)


def _pad_and_crop(image, seed):
    shape = tf.shape(image)
    pad = tf.maximum(shape[0] // 8, 1)
    padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
    return tf.image.stateless_random_crop(padded, shape, seed=seed)


def _augment_image(image, seeds, augmentation):
    if augmentation.crop == "resized":
        image = _random_resized_crop(image, seeds[0], augmentation.min_scale)
    elif augmentation.crop == "pad":
        image = _pad_and_crop(image, seeds[0])
    if augmentation.flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    return image


def _batch_augmenter(augmentation, seed):
    """Batch-level augmentation with Keras' core layers: RandAugment, then MixUp or CutMix."""
    randaugment = (
        keras.layers.RandAugment(
            value_range=(0, 255),
            num_ops=augmentation.randaugment_ops,
            factor=augmentation.randaugment_factor,
            seed=seed,
        )
        if augmentation.randaugment_ops
        else None
    )
    mixers = []
    if augmentation.mixup:
        mixers.append(keras.layers.MixUp(alpha=augmentation.mixup, seed=seed))
    if augmentation.cutmix:
        mixers.append(keras.layers.CutMix(factor=augmentation.cutmix, seed=seed))
    if randaugment is None and not mixers:
        return None

    def apply(images, labels, coin):
        if randaugment is not None:
            images = tf.clip_by_value(randaugment(images, training=True), 0.0, 255.0)
        if len(mixers) == 1:
            mixed = mixers[0]({"images": images, "labels": labels}, training=True)
            return mixed["images"], mixed["labels"]
        if mixers:
            branches = [
                lambda m=m: tuple(m({"images": images, "labels": labels}, training=True).values())
                for m in mixers
            ]
            images, labels = tf.cond(coin < 0.5, branches[0], branches[1])
        return images, labels

    return apply


def make_dataset(
    pairs,
    *,
    image_size,
    num_classes,
    batch_size,
    training,
    augmentation=NO_AUGMENTATION,
    seed=None,
    cache=True,
    num_examples=None,
):
    """Turns `(encoded image, label)` pairs into batches for `model.fit` / `evaluate`.

    Args:
        pairs: a `tf.data.Dataset` of `(encoded bytes, integer label)`, or of
            `(uint8 image, label)` (tfds), as `keras_vit.data` and tfds give.
        image_size: (height, width) of the model's input.
        num_classes: length of the one-hot labels.
        batch_size: global batch size (a `tf.distribute` strategy splits it).
        training: shuffle, augment and drop the last partial batch.
        augmentation: an `Augmentation`; ignored unless `training`.
        seed: int or None. Makes shuffling and augmentation repeatable.
        cache: keep images in memory after the first epoch: encoded ones for
            training (shuffled whole, then decoded each epoch), decoded and
            resized ones for evaluation.
        num_examples: the dataset's size, for the shuffle buffer; counted if None.

    Returns:
        A `tf.data.Dataset` of `(float32 images in [0, 255], one-hot labels)`.
    """
    image_size = tuple(image_size)

    def decode(image, label):
        if image.dtype == tf.string:
            image = decode_image(image)
        elif image.shape.rank == 3 and image.shape[-1] == 1:
            image = tf.image.grayscale_to_rgb(image)
        return image, label

    if not training:
        dataset = pairs.map(decode, num_parallel_calls=AUTOTUNE)
        # Resize before caching: evaluation images never change.
        dataset = dataset.map(lambda x, y: (resize(x, image_size), y), num_parallel_calls=AUTOTUNE)
        if cache:
            dataset = dataset.cache()
    else:
        if num_examples is None:
            num_examples = int(pairs.cardinality())
            if num_examples < 0:
                num_examples = 10_000
        encoded = pairs.element_spec[0].dtype == tf.string
        # Cache and shuffle before decoding: encoded images are small, so the buffer can
        # hold the whole dataset. Folders list images class by class, and a partial
        # shuffle of such a list gives batches of one or two classes.
        dataset = pairs.cache() if cache else pairs
        buffer = num_examples if encoded else min(num_examples, 10_000)
        dataset = dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.map(decode, num_parallel_calls=AUTOTUNE)
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(4)
        dataset = tf.data.Dataset.zip((dataset, seeds))

        def augment(pair, stream):
            image, label = pair
            per_op = tf.reshape(stream, (2, 2))
            image = _augment_image(image, per_op, augmentation)
            return resize(image, image_size), label

        dataset = dataset.map(augment, num_parallel_calls=AUTOTUNE)
    dataset = dataset.map(
        lambda x, y: (tf.ensure_shape(x, image_size + (3,)), tf.one_hot(y, num_classes)),
        num_parallel_calls=AUTOTUNE,
    )
    dataset = dataset.batch(batch_size, drop_remainder=training, num_parallel_calls=AUTOTUNE)
    augmenter = _batch_augmenter(augmentation, seed) if training else None
    if augmenter is not None:
        coins = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).map(
            lambda r: tf.cast(r % 1000, tf.float32) / 1000.0
        )
        dataset = tf.data.Dataset.zip((dataset, coins)).map(
            lambda batch, coin: augmenter(batch[0], batch[1], coin), num_parallel_calls=AUTOTUNE
        )
    return dataset.prefetch(AUTOTUNE)
