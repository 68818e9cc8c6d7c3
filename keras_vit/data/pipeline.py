"""The tf.data input pipeline: read, decode, resize, cache, shuffle, batch, prefetch.

Training batches are `{"images": uint8, "labels": int32}`: the pipeline only
reads, decodes, resizes and batches, and keeps decoded images in memory when
they fit (`DECODED_CACHE_BYTES`). Every augmentation runs on the batch inside
the compiled training step (`keras_vit.training.augment`), on the accelerator.
Evaluation batches are `(float32 images in [0, 255], one-hot labels)` at the
model's size; the model normalises them itself (`ViT(image_mean=...,
image_std=...)`), so training, export and the apps share one definition.
"""

import dataclasses
import functools

import tensorflow as tf

from keras_vit.data import datasets, images
from keras_vit.data.datasets import SEED, VALIDATION_SPLIT
from keras_vit.model.transform import DEFAULT

AUTOTUNE = tf.data.AUTOTUNE
# Decoded training images are cached in memory up to this size (CIFAR-10's 50,000
# images at 32x32 take 150 MB; ImageNet-1k at 224 would take 190 GB). Larger datasets
# cache their encoded files and decode every epoch.
DECODED_CACHE_BYTES = 4 * 1024**3
# A pass's shuffle seed is seed * _PASS_SEEDS + its number; the stream has no end in practice.
_PASS_SEEDS = 1_000_003
_ENDLESS = 2**62


def _as_written(function):
    """`function` for tf.data, traced as written: the pipeline's functions branch with `tf.cond`
    and `tf.where`, and in Python only on what is known when the graph is built, so AutoGraph's
    conversion (it parses and rewrites each function's source, once per process: about a
    second of every command's start) would change nothing."""
    return tf.autograph.experimental.do_not_convert(function)


# TIFF's two byte orders; TensorFlow decodes JPEG, PNG, GIF, BMP and WebP itself.
_TIFF_SIGNATURES = (b"II*\x00", b"MM\x00*")


def decode_image(encoded, channels=3):
    """Decodes any of `images.IMAGE_EXTENSIONS` to uint8 `(height, width, channels)`: the one
    decode of training, evaluation, verification and the served SavedModel, so a model learns
    from the pixels it will be given.

    RGB (`channels=3`) decodes as `keras_vit.data.images.load_image` reads files (`decode_upright`);
    TIFF goes through `images.load_image` itself, as in `keras-vit predict`.
    """
    if channels != 3:
        return tf.io.decode_image(encoded, channels=channels, expand_animations=False)
    return _decode_rgb(encoded)


# Traced once per process and called from every pipeline's graph (the check of a dataset's
# files, training, evaluation): its EXIF and format branches take most of a second to trace.
@tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
def _decode_rgb(encoded):
    is_tiff = tf.reduce_any([tf.equal(tf.strings.substr(encoded, 0, 4), s) for s in _TIFF_SIGNATURES])
    return tf.cond(is_tiff, lambda: _decode_with_pillow(encoded), lambda: decode_upright(encoded))


def starts_with(encoded, magic):
    """Whether the encoded bytes begin with `magic` (a format's signature)."""
    return tf.strings.substr(encoded, 0, len(magic)) == magic


_EXIF_WINDOW = 65536  # APP1 (Exif) comes first or second in a JPEG, within the first 64 KB


def _exif_orientation(encoded):
    """The EXIF orientation tag (1-8) of a JPEG, 1 when it has none: read with tensor ops only."""
    window = tf.strings.substr(tf.strings.join([encoded, tf.constant(b"\0" * _EXIF_WINDOW)]), 0, _EXIF_WINDOW)
    data = tf.io.decode_raw(window, tf.uint8)
    size = tf.constant(_EXIF_WINDOW, tf.int64)
    exif = tf.reduce_all(
        tf.stack([data[i : _EXIF_WINDOW - 6 + i] == c for i, c in enumerate(b"Exif\0\0")]), axis=0
    )
    tiff = tf.argmax(tf.cast(exif, tf.int32), output_type=tf.int64) + 6
    little = tf.gather(data, tiff) == ord("I")

    def number(positions, width):
        positions = tf.clip_by_value(positions, 0, size - width)
        values = tf.cast(tf.stack([tf.gather(data, positions + i) for i in range(width)], axis=-1), tf.int64)
        places = tf.pow(tf.constant(256, tf.int64), tf.range(width, dtype=tf.int64))
        return tf.where(little, tf.reduce_sum(values * places, -1), tf.reduce_sum(values * places[::-1], -1))

    directory = tiff + number(tiff + 4, 4)
    entries = directory + 2 + 12 * tf.range(64, dtype=tf.int64)
    is_orientation = tf.logical_and(
        number(entries, 2) == 0x0112, tf.range(64, dtype=tf.int64) < number(directory, 2)
    )
    value = number(tf.gather(entries, tf.argmax(tf.cast(is_orientation, tf.int32))) + 8, 2)
    valid = tf.reduce_any(exif) & tf.reduce_any(is_orientation) & (value >= 1) & (value <= 8)
    return tf.where(valid, value, 1)


def _orient(image, orientation):
    """Turns a decoded image upright, as Pillow's `ImageOps.exif_transpose` does."""
    branches = [
        lambda: image,
        lambda: tf.image.flip_left_right(image),
        lambda: tf.image.rot90(image, 2),
        lambda: tf.image.flip_up_down(image),
        lambda: tf.image.transpose(image),
        lambda: tf.image.rot90(image, 3),
        lambda: tf.image.rot90(tf.image.transpose(image), 2),
        lambda: tf.image.rot90(image, 1),
    ]
    return tf.switch_case(tf.cast(orientation - 1, tf.int32), branches)


def decode_upright(encoded):
    """Decodes a JPEG, PNG, GIF, BMP or WebP to uint8 RGB as `keras_vit.data.images.load_image` reads
    files: EXIF orientation applied, transparent pixels composited on white, the first frame of
    an animation, JPEGs with the accurate DCT (as Pillow). Tensor ops only, so a SavedModel
    carries it (`decode_image` adds TIFF, through Pillow)."""

    def jpeg():
        # The accurate DCT, as Pillow decodes: the apps and the server see the same pixels.
        image = tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE")
        return _orient(image, _exif_orientation(encoded))

    def with_alpha():
        image = tf.io.decode_image(
            encoded, channels=0, expand_animations=False
        )  # as stored: gray, gray + alpha, RGB or RGBA
        count = tf.shape(image)[-1]
        color = tf.cast(
            tf.cond(count < 3, lambda: tf.tile(image[..., :1], [1, 1, 3]), lambda: image[..., :3]), tf.float32
        )
        opaque = tf.fill(tf.concat([tf.shape(image)[:2], [1]], 0), tf.constant(255, image.dtype))
        alpha = tf.cast(tf.cond(count % 2 == 0, lambda: image[..., -1:], lambda: opaque), tf.float32) / 255.0
        return tf.cast(tf.round(color * alpha + 255.0 * (1.0 - alpha)), tf.uint8)

    return tf.case(
        [
            (starts_with(encoded, b"\xff\xd8\xff"), jpeg),
            # GIF: TensorFlow reads no transparency. BMP: the fourth byte of 32-bit pixels is
            # unused padding in the common format, and Pillow ignores it too.
            (
                starts_with(encoded, b"GIF8") | starts_with(encoded, b"BM"),
                lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False),
            ),
        ],
        default=with_alpha,
    )


def _decode_with_pillow(encoded):
    def load(data):  # a bytes scalar, or a 0-d object array holding one
        return images.load_image(data if isinstance(data, bytes) else data.item())

    image = tf.numpy_function(load, [encoded], tf.uint8, stateful=False)
    return tf.ensure_shape(image, (None, None, 3))


def resize(image, image_size, transform=DEFAULT):
    """Brings an image to `image_size` (height, width) by `transform` (resize, then centre crop),
    as float32 in [0, 255]: the width first, then the height, each pass rounded to 8 bits as
    Pillow (timm's reader) stores it; a side that keeps its size is not filtered.

    `keras_vit.data.images.resize` is the same in NumPy, for runs without TensorFlow. Both filter
    in float64 with the same weights, so their 8-bit roundings agree: TensorFlow's own resize
    computes in float32 and would round a tie the other way."""
    height, width = image_size
    image = tf.cast(image, tf.float64)
    if image.shape[:2].is_fully_defined():
        (new_height, new_width), (top, left) = transform.plan(tuple(image.shape[:2]), image_size)
    else:
        (new_height, new_width), (top, left) = plan(tf.shape(image)[:2], image_size, transform)
    kernel = _KERNELS[transform.interpolation]
    image = _unless_kept(image, 1, new_width, left, width, kernel)
    image = _unless_kept(image, 0, new_height, top, height, kernel)
    return tf.ensure_shape(tf.cast(image, tf.float32), (height, width, None))


def _triangle(x):
    x = tf.abs(x)
    return tf.where(x < 1.0, 1.0 - x, 0.0 * x)


def _keys_cubic(x):
    x = tf.abs(x)
    near = ((-0.5 + 2.0) * x - (-0.5 + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * -0.5
    return tf.where(x < 1.0, near, tf.where(x < 2.0, far, 0.0 * x))


# `keras_vit.data.images.KERNELS` in tensor ops (the same float64 operations, in the same order),
# with the radius each reaches.
_KERNELS = {"bilinear": (_triangle, 1.0), "bicubic": (_keys_cubic, 2.0)}


def _unless_kept(image, axis, new_size, start, length, kernel):
    """One pass along `axis` (0: height, 1: width) to `new_size`, keeping `length` from `start`;
    the crop alone when the side keeps its size."""
    size = image.shape[axis] if image.shape[axis] is not None else tf.shape(image)[axis]

    def crop(image):
        return image[start : start + length] if axis == 0 else image[:, start : start + length]

    if isinstance(new_size, int) and isinstance(size, int):  # known when the graph is built
        return crop(image) if new_size == size else _filter_pass(image, axis, new_size, start, length, kernel)
    return tf.cond(
        tf.equal(new_size, size),
        lambda: crop(image),
        lambda: _filter_pass(image, axis, new_size, start, length, kernel),
    )


def _filter_pass(image, axis, new_size, start, length, kernel):
    """`images.resize`'s pass (Pillow's fixed-point weights, whole numbers in float64) as a sparse
    band of a few taps per output pixel, whatever the photo's size, stored in 8 bits."""
    function, radius = kernel
    moved = image if axis == 0 else tf.transpose(image, (1, 0, 2))  # the filtered axis first
    size = tf.shape(moved)[0]
    scale = tf.cast(size, tf.float64) / tf.cast(new_size, tf.float64)
    kernel_scale = tf.maximum(scale, 1.0)  # antialiasing: a shrink averages all it covers
    centres = (tf.cast(tf.range(start, start + length), tf.float64) + 0.5) * scale
    first = tf.maximum(tf.cast(tf.math.floor(centres - radius * kernel_scale), tf.int32), 0)
    taps = tf.cast(tf.math.ceil(2 * radius * kernel_scale), tf.int32) + 2
    sources = first[:, None] + tf.range(taps)[None, :]  # (length, taps), every tap that weighs
    inside = sources < size
    weights = function((tf.cast(sources, tf.float64) - centres[:, None] + 0.5) * (1.0 / kernel_scale))
    weights = tf.where(inside, weights, 0.0 * weights)
    totals = tf.math.cumsum(weights, axis=1)[:, -1:]  # in order, as Pillow and NumPy add them
    weights = weights / tf.where(tf.equal(totals, 0.0), tf.ones_like(totals), totals)
    weights = weights * images.PRECISION + tf.where(weights < 0, -0.5 + 0.0 * weights, 0.5 + 0.0 * weights)
    weights = tf.where(weights < 0, tf.math.ceil(weights), tf.math.floor(weights))  # towards zero
    outputs = tf.broadcast_to(tf.range(length)[:, None], tf.shape(sources))
    matrix = tf.sparse.SparseTensor(  # (length, size), in row-major order
        tf.cast(tf.boolean_mask(tf.stack([outputs, sources], -1), inside), tf.int64),
        tf.boolean_mask(weights, inside),
        tf.cast(tf.stack([length, size]), tf.int64),
    )
    rest = tf.shape(moved)[1:]
    sums = tf.sparse.sparse_dense_matmul(matrix, tf.reshape(moved, (size, -1)))
    sums = tf.reshape(sums, tf.concat([[length], rest], 0))
    sums = sums if axis == 0 else tf.transpose(sums, (1, 0, 2))
    # As images.to_8_bits: whole numbers below 2**53 are exact in float64, in any order.
    return tf.clip_by_value(tf.floor((sums + images.PRECISION / 2) / images.PRECISION), 0.0, 255.0)


def plan(source_size, image_size, transform):
    """`Transform.plan` in tensor ops, for images whose size is known only when they are read
    (the served SavedModel): the same float64 arithmetic, truncation and ties-to-even rounding."""
    height, width = (tf.cast(source_size[i], tf.float64) for i in (0, 1))
    scale_h, scale_w = transform.scale_size(image_size)

    def whole(value):
        return tf.cast(value, tf.int32)

    if transform.crop_mode == "squash":
        resized = tf.constant([scale_h, scale_w], tf.int32)
    elif scale_h == scale_w:
        resized = tf.where(
            width <= height,
            tf.stack([whole(scale_h * height / width), scale_w]),
            tf.stack([scale_h, whole(scale_w * width / height)]),
        )
    else:
        ratio = tf.minimum(height / scale_h, width / scale_w)
        resized = whole(tf.round(tf.stack([height / ratio, width / ratio])))
    corner = whole(tf.round(tf.cast(resized - tf.constant(image_size, tf.int32), tf.float64) / 2))
    return (resized[0], resized[1]), (corner[0], corner[1])


def _decode(image, label):
    """Encoded bytes (folders, zips) or uint8 arrays (tfds) to uint8 RGB."""
    if image.dtype == tf.string:
        image = decode_image(image)
    elif image.shape.rank == 3 and image.shape[-1] == 1:
        image = tf.image.grayscale_to_rgb(image)
    return image, label


def _resize_uint8(image, image_size):
    """Resizes as `resize` does, as uint8 (its values are 8-bit: 4x smaller to cache than float32)."""
    if image.shape[0] == image_size[0] and image.shape[1] == image_size[1]:
        return image
    return tf.cast(resize(image, image_size), tf.uint8)


def _count(pairs, num_examples):
    if num_examples is not None:
        return num_examples
    count = int(pairs.cardinality())
    return count if count >= 0 else 10_000


def training_batches(
    pairs, *, image_size, batch_size, seed=0, num_examples=None, cache=True, repeats=1, start_batch=0
):
    """An endless stream of shuffled batches of `{"images": uint8, "labels": int32}` at `image_size`,
    for `model.fit` with `steps_per_epoch`.

    The stream is pass after pass over the data, each pass shuffled with its own seed (from `seed`
    and the pass's number) and cut to whole batches. Batch k is therefore the same in every run
    with the same seed, and `start_batch=k` starts the stream there without decoding what it
    skips: a run resumed at step k trains on exactly the batches it would have.

    Args:
        pairs: a `tf.data.Dataset` of `(encoded bytes, integer label)`, or of
            `(uint8 image, label)` (tfds), as `keras_vit.data.datasets` and tfds give.
        image_size: (height, width) of the model's input.
        batch_size: global batch size (a `tf.distribute` strategy splits it); each
            pass drops its last partial batch.
        seed: int. Chooses every pass's order.
        num_examples: the dataset's size, for the cache choice and the
            shuffle buffer; counted if None.
        cache: keep images in memory after the first pass: decoded when
            they take at most `DECODED_CACHE_BYTES`, else encoded.
        repeats: repeated augmentation (Hoffer et al. 2020; DeiT): each image
            comes `repeats` times in a row, so in one batch, where the training
            step augments each copy differently. A pass keeps its length, so
            it holds a new 1/`repeats` of the images each time.
        start_batch: the first batch of the stream to give.
    """
    image_size = tuple(image_size)
    num_examples = _count(pairs, num_examples)
    batches_per_pass = num_examples // batch_size
    if batches_per_pass == 0:
        raise ValueError(f"{num_examples} images make no batch of {batch_size}: lower the batch size.")
    examples, decode, buffer = _cached_examples(pairs, image_size, num_examples, cache)
    items_per_pass = batches_per_pass * batch_size
    first_pass, first_offset = divmod(start_batch * batch_size, items_per_pass)

    def one_pass(index):
        # Item i of a pass is copy i % repeats of the pass's (i // repeats)-th image.
        offset = tf.where(index == first_pass, tf.constant(first_offset, tf.int64), 0)
        shuffled = _shuffled(examples, buffer, seed=seed * _PASS_SEEDS + index)
        items = shuffled.skip(offset // repeats).map(_as_written(decode), num_parallel_calls=AUTOTUNE)
        if repeats > 1:
            items = items.flat_map(
                _as_written(lambda *item: tf.data.Dataset.from_tensors(item).repeat(repeats))
            )
            items = items.skip(offset % repeats)
        return items.take(items_per_pass - offset)

    stream = tf.data.Dataset.range(first_pass, _ENDLESS).flat_map(_as_written(one_pass))
    stream = stream.map(
        _as_written(
            lambda image, label: {"images": tf.ensure_shape(image, image_size + (3,)), "labels": label}
        ),
        num_parallel_calls=AUTOTUNE,
    )
    return stream.batch(batch_size, drop_remainder=True, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)


def _shuffled(examples, buffer, seed):
    """`examples` shuffled by `seed` (a tensor) alone. TensorFlow combines an op's seed with the
    global one in Python, which fails for a tensor when the global seed is 0: the order depends
    on the run's seed only, so the global one is left out."""
    graph = tf.compat.v1.get_default_graph()  # the pass function's graph
    global_seed, graph.seed = graph.seed, None
    try:
        return examples.shuffle(buffer, seed=seed, reshuffle_each_iteration=False)
    finally:
        graph.seed = global_seed


def undecodable(pairs, count):
    """The indices of the `count` `(encoded, label)` pairs `decode_image` cannot decode, in order."""
    decodable = (
        pairs.enumerate()
        .map(
            _as_written(lambda index, pair: (index, tf.shape(_decode(*pair)[0]))), num_parallel_calls=AUTOTUNE
        )
        .ignore_errors()
        .map(_as_written(lambda index, _: index))
    )
    good = set(decodable.as_numpy_iterator())
    return [index for index in range(count) if index not in good]


def check_images(splits):
    """Raises a one-line ValueError naming the files of `splits` (folder and `.zip` splits) that
    do not decode: refused before training starts rather than met mid-epoch, where the error
    could not name the file and a run resumed without it would see other batches."""
    splits = [split for split in splits if isinstance(split, datasets.Split) and len(split)]
    if not splits:
        return
    pairs = splits[0].to_dataset()
    for split in splits[1:]:
        pairs = pairs.concatenate(split.to_dataset())  # one pass: the decode is traced once
    names = [name for split in splits for name in split.names or [f"image {i}" for i in range(len(split))]]
    bad = [names[i] for i in undecodable(pairs, len(names))]
    if bad:
        named = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(
            f"{len(bad)} of the dataset's files are not images that decode (not an image, or "
            f"truncated): {named}. Delete or replace them, then run the same command again."
        )


def _cached_examples(pairs, image_size, num_examples, cache):
    """(examples, decode, shuffle buffer): the examples a pass shuffles, kept in memory, and what
    turns one into a uint8 image at `image_size` with its int32 label."""

    def decode_and_resize(image, label):
        image, label = _decode(image, label)
        return _resize_uint8(image, image_size), tf.cast(label, tf.int32)

    def decoded(image, label):
        return image, label

    if cache and num_examples * image_size[0] * image_size[1] * 3 <= DECODED_CACHE_BYTES:
        return (
            pairs.map(_as_written(decode_and_resize), num_parallel_calls=AUTOTUNE).cache(),
            decoded,
            num_examples,
        )
    # Cache and shuffle before decoding: encoded images are small, so the buffer can hold the
    # whole dataset. Folders list images class by class, and a partial shuffle of such a list
    # gives batches of one or two classes.
    encoded = pairs.element_spec[0].dtype == tf.string
    buffer = num_examples if encoded else min(num_examples, 10_000)
    return (pairs.cache() if cache else pairs), decode_and_resize, buffer


def evaluation_batches(pairs, *, image_size, batch_size, cache=True, transform=DEFAULT):
    """Batches of `{"images": float32 in [0, 255], "labels": int32}` in the dataset's order.

    Images are brought to `image_size` by the model's evaluation `transform`, as every reader of
    the model reads them (`keras_vit.data.contract`). `cache` keeps them in memory, resized.
    """
    image_size = tuple(image_size)

    def decode_and_resize(image, label):
        image, label = _decode(image, label)
        image = tf.ensure_shape(resize(image, image_size, transform), image_size + (3,))
        return {"images": image, "labels": tf.cast(label, tf.int32)}

    dataset = pairs.map(_as_written(decode_and_resize), num_parallel_calls=AUTOTUNE)
    if cache:
        dataset = dataset.cache()
    return dataset.batch(batch_size, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """A dataset read as `keras-vit train` reads it (`read_training_data`)."""

    source: str
    class_names: list
    train_count: int
    validation_count: int
    steps_per_epoch: int  # whole batches in one pass over the training images
    validation: object  # `evaluation_batches` of the validation split; None when it has none
    _stream: object

    def train_from(self, step=0):
        """The training stream (`training_batches`) from its batch `step`: endless, so give
        `model.fit` `steps_per_epoch`; batches of `{"images": uint8, "labels": int32}`."""
        return self._stream(start_batch=step)

    def keras_datasets(self):
        """`(train_ds, val_ds)` for a plain Keras `model.fit`: batches of `(float32 images in
        [0, 255], int32 labels)` at the model's size, unaugmented (`keras-vit train` augments
        them in its training step: `keras_vit.training.augment`). `train_ds` is endless, each pass over
        the data in a new order:

            model.fit(train_ds, validation_data=val_ds, steps_per_epoch=data.steps_per_epoch, epochs=10)
        """

        def as_pair(batch):
            return tf.cast(batch["images"], tf.float32), batch["labels"]

        validation = self.validation.map(_as_written(as_pair)) if self.validation is not None else None
        return self.train_from(0).map(_as_written(as_pair), num_parallel_calls=AUTOTUNE), validation


def read_training_data(
    dataset,
    *,
    image_size,
    batch_size,
    validation_split=VALIDATION_SPLIT,
    seed=SEED,
    repeats=1,
    transform=DEFAULT,
):
    """Reads a dataset as `keras-vit train` does: a folder of class folders, a `.zip` of one,
    a tensorflow-datasets name (`"cifar10"`) or an embedded one (`keras_vit.data.datasets.load_dataset`), its
    validation split carved with `seed` unless it has its own, every image checked to decode
    first, decoded as the exported models decode (EXIF orientation, the accurate DCT) and
    resized to `image_size`; validation images are read by the model's evaluation `transform`.

        data = keras_vit.pipeline.read_training_data("photos/", image_size=(224, 224), batch_size=32)
        train_ds, val_ds = data.keras_datasets()
        data.class_names  # the folder names, sorted: the labels' order

    Raises:
        FileNotFoundError: nothing at `dataset`.
        ValueError: files that do not decode (named), or fewer training images than one batch.
    """
    found = datasets.load_dataset(dataset, validation_split=validation_split, seed=seed)
    train_split, val_split = found["train"], found["validation"]
    if not len(train_split):
        raise ValueError(
            f"{found.source} has no training images: a dataset to train on keeps them in "
            f"train/class_name/ (or class_name/ with no split folders); one of val/ or test/ alone "
            f"is for `keras-vit evaluate`."
        )
    check_images([train_split, val_split])
    if len(train_split) < batch_size:
        raise ValueError(
            f"{found.source} has {len(train_split)} training images, fewer than one batch of "
            f"{batch_size}; lower --batch-size."
        )
    image_size = tuple(image_size)
    validation = None
    if len(val_split):
        validation = evaluation_batches(
            val_split.to_dataset(), image_size=image_size, batch_size=batch_size, transform=transform
        )
    return TrainingData(
        source=found.source,
        class_names=list(found.class_names),
        train_count=len(train_split),
        validation_count=len(val_split),
        steps_per_epoch=len(train_split) // batch_size,
        validation=validation,
        _stream=functools.partial(
            training_batches,
            train_split.to_dataset(),
            image_size=image_size,
            batch_size=batch_size,
            seed=seed,
            num_examples=len(train_split),
            repeats=repeats,
        ),
    )
