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

from keras_vit.pipeline import decode_image, resize

TOP_K = 5
LABELS_FILE = "labels.txt"
# Magic numbers of the formats tf.io.decode_image reads.
_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM")


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
        known = tf.reduce_any([tf.strings.substr(encoded, 0, len(m)) == m for m in _SIGNATURES])
        message = tf.strings.format(
            "image_bytes[{}] is not a JPEG, PNG, GIF or BMP image: send the file's bytes "
            '(base64 in REST: {"b64": "..."}).',
            index,
        )
        with tf.control_dependencies([tf.debugging.Assert(known, [message])]):
            image = decode_image(encoded, channels=channels)
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
