"""A model's input contract: what it takes, read from the model, and the one way to meet it.

keras-vit models take RGB pixels in [0, 255] at their image size; the normalisation is inside
the model. How a file becomes those pixels is one policy, here: decoded upright (EXIF
orientation), RGB with transparency on white, the first frame of an animation, JPEGs with the
accurate DCT, at most `images.MAX_SIDE` on the long side; then resized by the one rule
(bilinear, antialiased, skipped when the image fits).

The contract applies it three ways, one per place a model runs: `read` / `resize` in NumPy
(predict, the apps, evaluating a `.tflite`: no TensorFlow), `decode_and_resize` in TensorFlow
(tf.data's training and evaluation, verification, the served SavedModel; `pipeline` holds the
ops) and `resize_batch` in Keras ops (a teacher's input, inside the compiled step, on any
backend). The phone's `preprocess.js` is its port to JavaScript. Tests hold each equal to the
others on every image type.
"""

import dataclasses

from keras_vit.data import images

# The resize rule, as runs and exports record it.
RESIZE = "bilinear, antialiased"
INPUT = "RGB pixels in [0, 255]"


@dataclasses.dataclass(frozen=True)
class InputContract:
    """What a model takes: `image_size` (height, width), `channels`, `class_names` (or None),
    and `image_mean` / `image_std` when the model normalises inside (None when it does not)."""

    image_size: tuple
    channels: int = 3
    class_names: list | None = None
    image_mean: list | None = None
    image_std: list | None = None

    @classmethod
    def of(cls, model):
        """The contract of a Keras ViT, a `Classifier` or a `Runner`: whatever carries
        `image_size` (and, where it has them, `channels`, `class_names`, `image_mean`, `image_std`)."""
        found = {field.name: getattr(model, field.name, None) for field in dataclasses.fields(cls)}
        if found["image_size"] is None:
            raise ValueError(f"{type(model).__name__} has no image size: not a keras-vit image classifier.")
        found["image_size"] = tuple(int(side) for side in found["image_size"])
        found["channels"] = found["channels"] or 3
        found["class_names"] = None if found["class_names"] is None else list(found["class_names"])
        return cls(**found)

    def read(self, source):
        """An image file (path or bytes) as float32 pixels at `image_size`: what the model takes.

        Raises:
            FileNotFoundError: no file at the path.
            ValueError: a directory, an empty file, or not a decodable image (named).
        """
        return self.resize(images.load_image(source))

    def resize(self, pixels):
        """Upright RGB pixels resized by the one rule, float32 in [0, 255]."""
        return images.resize(pixels, self.image_size)

    def decode_and_resize(self, encoded, *, tensor_ops_only=False):
        """Encoded image bytes (a string tensor) as float32 pixels at `image_size`, in TensorFlow.

        `tensor_ops_only`: no Python in the graph, as a SavedModel must carry it; TIFF, which
        TensorFlow does not decode, is then not read.
        """
        from keras_vit.data import pipeline  # TensorFlow: only where a graph is built

        if tensor_ops_only and self.channels == 3:
            image = pipeline.decode_upright(encoded)
        else:
            image = pipeline.decode_image(encoded, channels=self.channels)
        return pipeline.resize(image, self.image_size)

    def resize_batch(self, pixels):
        """A batch `(n, h, w, channels)` of float pixels resized by the one rule in Keras ops, for
        use inside a compiled step on any backend."""
        from keras import ops

        if tuple(pixels.shape[1:3]) == self.image_size:
            return pixels
        return ops.image.resize(pixels, self.image_size, interpolation="bilinear", antialias=True)

    def description(self):
        """The contract in words and numbers, as runs (`preprocessing.json`) and export manifests
        record it."""
        return {
            "input": f"{INPUT}, resized to image_size ({RESIZE}); normalisation is inside the model",
            "input_range": [0, 255],
            "image_size": list(self.image_size),
            "resize": f"{RESIZE}, to image_size",
            "image_mean": self.image_mean,
            "image_std": self.image_std,
        }
