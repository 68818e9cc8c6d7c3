"""The SavedModel for TF Serving: encoded images in, probabilities and class names out.

Signatures:
    serving_default: `image_bytes`, a batch of encoded JPEG, PNG, GIF, BMP or WebP
        images (string). The `_bytes` suffix lets TF Serving's REST API take
        `{"instances": [{"b64": "..."}]}`. Decoding, resizing and normalising
        happen in the graph, with the model's own preprocessing.
    serving_images: `images`, float32 `(batch, height, width, channels)`
        pixels in [0, 255], already at the model's size.

Both return `probabilities` (batch, classes), and the `top_k_indices`,
`top_k_classes` and `top_k_probabilities` (batch, k) of each image.
"""

import json
import os

import tensorflow as tf

from keras_vit.data.contract import InputContract
from keras_vit.data.pipeline import starts_with
from keras_vit.inference.runtimes import TOP_K
from keras_vit.storage.export_folder import LABELS_FILE, LICENSE_FILE, TRANSFORM_FILE

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
# MAX_IMAGE_PIXELS), the same rule as keras_vit.data.images.load_image. Checked on the header,
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
            (starts_with(encoded, b"\x89PNG"), png),
            (starts_with(encoded, b"GIF8"), gif),
            (starts_with(encoded, b"BM"), bmp),
            (starts_with(encoded, b"\xff\xd8\xff"), jpeg),
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

    long_png = tf.logical_and(starts_with(encoded, b"\x89PNG"), tf.strings.length(encoded) >= 12)
    return tf.case(
        [(starts_with(encoded, b"\xff\xd8\xff"), jpeg_end), (long_png, png_end)],
        default=lambda: tf.constant(True),
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
    """Encoded images -> float32 pixels at the model's size, read by the model's input contract
    (as training reads them), each checked first for what a server must refuse."""
    contract = InputContract.of(classifier)
    (height, width), channels = contract.image_size, contract.channels

    def decode(item):
        encoded, index = item
        known = tf.reduce_any([starts_with(encoded, m) for m in _SIGNATURES])
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
            image = contract.decode_and_resize(encoded, tensor_ops_only=True)
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
    # An ExportArchive restores under TF1-style loaders (TF Serving, saved_model_cli). It saves the
    # variables its endpoints read; `track` would only add a walk of every layer for lookup tables,
    # which a ViT has none of (about 2.5 CPU-s a write for the 12-block ViT-Ti).
    archive = keras.export.ExportArchive()
    images_spec = tf.TensorSpec([None, height, width, classifier.channels], tf.float32, name="images")
    # One trace of the model for both signatures: the bytes signature calls the images one's
    # function (a call in the graph, not a second copy of the model).
    classify = tf.function(lambda images: _classify_images(classifier, images), input_signature=[images_spec])
    archive.add_endpoint(
        "serving_default",
        lambda image_bytes: classify(_decode_batch(classifier, image_bytes)),
        [tf.TensorSpec([None], tf.string, name="image_bytes")],
    )
    archive.add_endpoint("serving_images", classify, [images_spec])
    archive.write_out(os.fspath(path), verbose=False)
    # Plain-text labels beside the graph, for clients that want all names without a request.
    os.makedirs(os.path.join(path, "assets"), exist_ok=True)
    with open(os.path.join(path, "assets", LABELS_FILE), "w") as f:
        f.write("".join(f"{name}\n" for name in classifier.class_names))
    with open(os.path.join(path, "assets", TRANSFORM_FILE), "w") as f:
        json.dump(classifier.transform.config(), f)
    if classifier.license:  # the weights' licence, beside the labels
        with open(os.path.join(path, "assets", LICENSE_FILE), "w") as f:
            f.write(classifier.license + "\n")
