"""The SavedModel for TF Serving: encoded images in, probabilities and class names out.

Signatures:
    serving_default: `image_bytes`, a batch of encoded JPEG, PNG, GIF or BMP
        images (string). The `_bytes` suffix lets TF Serving's REST API take
        `{"instances": [{"b64": "..."}]}`. Decoding, resizing and normalising
        happen in the graph, with the model's own preprocessing.
    serving_images: `images`, float32 `(batch, height, width, channels)`
        pixels in [0, 255], already at the model's size.

Both return `probabilities` (batch, classes), and the `top_k_indices`,
`top_k_classes` and `top_k_probabilities` (batch, k) of each image.
"""

import os

import tensorflow as tf

from keras_vit.export_folder import LABELS_FILE
from keras_vit.pipeline import decode_image, resize
from keras_vit.runtimes import TOP_K

# TF Serving's server-side batching (`--enable_batching --batching_parameters_file=...`):
# requests arriving within 2 ms are run as one batch of up to 32 images, which serving_default's
# dynamic batch dimension allows. Written once beside the versions; tune it for your hardware.
BATCHING_PARAMETERS = """max_batch_size { value: 32 }
batch_timeout_micros { value: 2000 }
max_enqueued_batches { value: 100 }
num_batch_threads { value: 4 }
pad_variable_length_inputs: false
"""

# Magic numbers of the formats tf.io.decode_image reads (WebP: "RIFF", a size, "WEBP").
_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM")
# The most pixels an image may declare: where Pillow refuses a decompression bomb (twice its
# MAX_IMAGE_PIXELS), the same rule as keras_vit.images.load_image. Checked on the header,
# before anything is allocated.
MAX_PIXELS = 2 * 89_478_485


def _header(encoded, start, count):
    padded = tf.strings.join([encoded, tf.constant(b"\0" * 32)])  # short files read as zeros
    return tf.strings.substr(padded, start, count)


def _header_bytes(encoded, start, count):
    return tf.cast(tf.io.decode_raw(_header(encoded, start, count), tf.uint8), tf.int64)


def _little_endian(values):
    places = tf.range(tf.size(values, out_type=tf.int64))
    return tf.reduce_sum(values * tf.pow(tf.constant(256, tf.int64), places))


def _big_endian(values):
    return _little_endian(tf.reverse(values, [0]))


def _starts_with(encoded, magic):
    return tf.strings.substr(encoded, 0, len(magic)) == magic


def _is_webp(encoded):
    riff, webp = _header(encoded, 0, 4), _header(encoded, 8, 4)
    return tf.logical_and(riff == b"RIFF", webp == b"WEBP")


def _declared_size(encoded):
    """(width, height) as the file's header states them, read without decoding the image."""

    def png():
        b = _header_bytes(encoded, 16, 8)
        return _big_endian(b[:4]), _big_endian(b[4:])

    def gif():
        b = _header_bytes(encoded, 6, 4)
        return _little_endian(b[:2]), _little_endian(b[2:])

    def bmp():
        b = _header_bytes(encoded, 18, 8)
        height = _little_endian(b[4:])
        return _little_endian(b[:4]), tf.where(height >= 2**31, 2**32 - height, height)  # top-down: negative

    def jpeg():
        shape = tf.cast(tf.image.extract_jpeg_shape(encoded), tf.int64)
        return shape[1], shape[0]

    def webp():
        chunk = _header(encoded, 12, 4)
        extended = _header_bytes(encoded, 24, 6)  # VP8X: 24-bit width - 1, height - 1
        extended_size = (_little_endian(extended[:3]) + 1, _little_endian(extended[3:]) + 1)
        lossless = _little_endian(_header_bytes(encoded, 21, 4))  # VP8L: 14-bit fields
        lossy = _header_bytes(encoded, 26, 4)  # VP8: 14-bit width and height
        return tf.case(
            [
                (chunk == b"VP8X", lambda: extended_size),
                (chunk == b"VP8L", lambda: ((lossless % 2**14) + 1, (lossless // 2**14) % 2**14 + 1)),
            ],
            default=lambda: (_little_endian(lossy[:2]) % 2**14, _little_endian(lossy[2:]) % 2**14),
        )

    return tf.case(
        [
            (_starts_with(encoded, b"\x89PNG"), png),
            (_starts_with(encoded, b"GIF8"), gif),
            (_starts_with(encoded, b"BM"), bmp),
            (_starts_with(encoded, b"\xff\xd8\xff"), jpeg),
            (_is_webp(encoded), webp),
        ],
        default=lambda: (tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
    )


def _has_end_marker(encoded):
    """Whether the file still has its end: IEND for PNG, an end-of-image marker for JPEG.

    Phones may append data after a JPEG's end marker, so a JPEG is only checked to hold one.
    """

    def jpeg_end():
        data = tf.io.decode_raw(tf.strings.join([encoded, tf.constant(b"\0\0")]), tf.uint8)
        return tf.reduce_any(tf.logical_and(data[:-1] == 0xFF, data[1:] == 0xD9))

    def png_end():
        return tf.strings.substr(encoded, -8, 4) == b"IEND"

    long_png = tf.logical_and(_starts_with(encoded, b"\x89PNG"), tf.strings.length(encoded) >= 12)
    return tf.case(
        [(_starts_with(encoded, b"\xff\xd8\xff"), jpeg_end), (long_png, png_end)],
        default=lambda: tf.constant(True),
    )


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


def _decode_upright(encoded, channels):
    """Decodes as `keras_vit.images.load_image` reads files: EXIF orientation applied,
    transparent pixels composited on white, the first frame of an animation."""
    if channels != 3:
        return decode_image(encoded, channels=channels)

    def jpeg():
        # The accurate DCT, as Pillow decodes: the apps and the server see the same pixels.
        image = tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE")
        return _orient(image, _exif_orientation(encoded))

    def with_alpha():
        image = decode_image(encoded, channels=0)  # as stored: gray, gray + alpha, RGB or RGBA
        count = tf.shape(image)[-1]
        color = tf.cast(
            tf.cond(count < 3, lambda: tf.tile(image[..., :1], [1, 1, 3]), lambda: image[..., :3]), tf.float32
        )
        opaque = tf.fill(tf.concat([tf.shape(image)[:2], [1]], 0), tf.constant(255, image.dtype))
        alpha = tf.cast(tf.cond(count % 2 == 0, lambda: image[..., -1:], lambda: opaque), tf.float32) / 255.0
        return tf.cast(tf.round(color * alpha + 255.0 * (1.0 - alpha)), tf.uint8)

    return tf.case(
        [
            (_starts_with(encoded, b"\xff\xd8\xff"), jpeg),
            # GIF: TensorFlow reads no transparency. BMP: the fourth byte of 32-bit pixels is
            # unused padding in the common format, and Pillow ignores it too.
            (
                _starts_with(encoded, b"GIF8") | _starts_with(encoded, b"BM"),
                lambda: decode_image(encoded, channels=3),
            ),
        ],
        default=with_alpha,
    )


def _classify_images(classifier, images):
    probabilities = classifier.probabilities(images)
    top = tf.math.top_k(probabilities, k=min(TOP_K, classifier.num_classes))
    return {
        "probabilities": probabilities,
        "top_k_indices": top.indices,
        "top_k_classes": tf.gather(tf.constant(classifier.class_names), top.indices),
        "top_k_probabilities": top.values,
    }


def _decode_batch(classifier, image_bytes):
    """Encoded images -> float32 pixels at the model's size, as the training pipeline decodes them."""
    height, width = classifier.image_size
    channels = classifier.channels

    def decode(item):
        encoded, index = item
        known = tf.reduce_any([_starts_with(encoded, m) for m in _SIGNATURES])
        known = tf.logical_or(known, _is_webp(encoded))
        message = tf.strings.format(
            "image_bytes[{}] is not a JPEG, PNG, GIF, BMP or WebP image: send the file's bytes "
            '(base64 in REST: {"b64": "..."}).',
            index,
        )
        # Checked in order, each before the next reads the bytes: a known format, a whole
        # file, a size worth decoding.
        truncated = tf.strings.format(
            "image_bytes[{}] is truncated (its end marker is missing): send the whole file.", index
        )
        with tf.control_dependencies([tf.debugging.Assert(known, [message])]):
            complete = _has_end_marker(encoded)
        with tf.control_dependencies([tf.debugging.Assert(complete, [truncated])]):
            image_width, image_height = _declared_size(encoded)
        too_large = tf.strings.format(
            "image_bytes[{}] declares {} x {} pixels, more than the {} this server decodes: "
            "send a smaller image.",
            (index, image_width, image_height, MAX_PIXELS),
        )
        small_enough = image_width * image_height <= MAX_PIXELS
        with tf.control_dependencies([tf.debugging.Assert(small_enough, [too_large])]):
            image = _decode_upright(encoded, channels)
        image = resize(image, (height, width))
        return tf.ensure_shape(image, (height, width, channels))

    indices = tf.range(tf.shape(image_bytes)[0])
    return tf.map_fn(
        decode,
        (image_bytes, indices),
        fn_output_signature=tf.TensorSpec((height, width, channels), tf.float32),
    )


def write_saved_model(classifier, path):
    """Writes the serving SavedModel to `path` (a new folder)."""
    import keras

    height, width = classifier.image_size
    archive = keras.export.ExportArchive()  # restores under TF1-style loaders (TF Serving, saved_model_cli)
    archive.track(classifier.model)
    archive.add_endpoint(
        "serving_default",
        lambda image_bytes: _classify_images(classifier, _decode_batch(classifier, image_bytes)),
        [tf.TensorSpec([None], tf.string, name="image_bytes")],
    )
    archive.add_endpoint(
        "serving_images",
        lambda images: _classify_images(classifier, images),
        [tf.TensorSpec([None, height, width, classifier.channels], tf.float32, name="images")],
    )
    archive.write_out(os.fspath(path), verbose=False)
    # Plain-text labels beside the graph, for clients that want all names without a request.
    os.makedirs(os.path.join(path, "assets"), exist_ok=True)
    with open(os.path.join(path, "assets", LABELS_FILE), "w") as f:
        f.write("".join(f"{name}\n" for name in classifier.class_names))
