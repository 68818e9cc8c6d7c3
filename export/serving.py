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


class ServingModule(tf.Module):
    """Holds the model's variables and the two serving functions."""

    def __init__(self, classifier):
        super().__init__(name=None)
        self._classifier = classifier
        # Tracked so that tf.saved_model.save writes the weights.
        self.model_variables = list(classifier.model.variables)
        self.class_names = tf.constant(classifier.class_names)
        height, width = classifier.image_size
        channels = classifier.channels
        self.classify_bytes = tf.function(
            self._classify_bytes,
            input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
        )
        self.classify_images = tf.function(
            self._classify_images,
            input_signature=[tf.TensorSpec([None, height, width, channels], tf.float32, name="images")],
        )

    def _classify_images(self, images):
        probabilities = self._classifier.probabilities(images)
        k = min(TOP_K, self._classifier.num_classes)
        top = tf.math.top_k(probabilities, k=k)
        return {
            "probabilities": probabilities,
            "top_k_indices": top.indices,
            "top_k_classes": tf.gather(self.class_names, top.indices),
            "top_k_probabilities": top.values,
        }

    def _classify_bytes(self, image_bytes):
        height, width = self._classifier.image_size
        channels = self._classifier.channels

        def decode(item):
            encoded, index = item
            known = tf.reduce_any([tf.strings.substr(encoded, 0, len(m)) == m for m in _SIGNATURES])
            message = tf.strings.format(
                "image_bytes[{}] is not a JPEG, PNG, GIF or BMP image: send the file's bytes "
                '(base64 in REST: {"b64": "..."}).',
                index,
            )
            check = tf.debugging.Assert(known, [message])
            with tf.control_dependencies([check]):
                image = decode_image(encoded, channels=channels)
            image = resize(image, (height, width))
            return tf.ensure_shape(image, (height, width, channels))

        indices = tf.range(tf.shape(image_bytes)[0])
        images = tf.map_fn(
            decode,
            (image_bytes, indices),
            fn_output_signature=tf.TensorSpec((height, width, channels), tf.float32),
        )
        return self._classify_images(images)


def write_saved_model(classifier, path):
    """Writes the serving SavedModel to `path` (a new folder)."""
    module = ServingModule(classifier)
    signatures = {
        "serving_default": module.classify_bytes.get_concrete_function(),
        "serving_images": module.classify_images.get_concrete_function(),
    }
    tf.saved_model.save(module, os.fspath(path), signatures=signatures)
    # Plain-text labels beside the graph, for clients that want all names without a request.
    os.makedirs(os.path.join(path, "assets"), exist_ok=True)
    with open(os.path.join(path, "assets", LABELS_FILE), "w") as f:
        f.write("".join(f"{name}\n" for name in classifier.class_names))
