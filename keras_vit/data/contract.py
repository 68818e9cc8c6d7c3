"""A model's input contract: what it takes, read from the model, and the one way to meet it.

keras-vit models take RGB pixels in [0, 255] at their image size; the normalisation is inside
the model. How a file becomes those pixels is one policy, here: decoded upright (EXIF
orientation), RGB with transparency on white, the first frame of an animation, JPEGs with the
accurate DCT, at most `images.MAX_SIDE` on the long side; then brought to the model's size by
the model's evaluation transform (`keras_vit.model.transform`: timm's resize and centre crop,
antialiased; a plain bilinear resize for keras-vit's own models).

The contract applies it three ways, one per place a model runs: `read` / `resize` in NumPy
(predict, the apps, evaluating a `.tflite`: no TensorFlow), `decode_and_resize` in TensorFlow
(tf.data's training and evaluation, verification, the served SavedModel; `pipeline` holds the
ops) and `resize_batch` in Keras ops (a teacher's input, inside the compiled step, on any
backend). The phone's `preprocess.js` is its port to JavaScript. Tests hold each equal to the
others on every image type.
"""

import dataclasses

from keras_vit.data import images
from keras_vit.model.transform import DEFAULT, Transform

# The rule the phone page ports (preprocess.js), by name: model.json carries it, the page refuses another.
RESIZE = "antialiased resize, then centre crop"
INPUT = "RGB pixels in [0, 255]"


@dataclasses.dataclass(frozen=True)
class InputContract:
    """What a model takes: `image_size` (height, width), `channels`, `class_names` (or None),
    `image_mean` / `image_std` when the model normalises inside (None when it does not), and the
    evaluation `transform` that brings an image to `image_size`."""

    image_size: tuple
    channels: int = 3
    class_names: list | None = None
    image_mean: list | None = None
    image_std: list | None = None
    transform: Transform = DEFAULT

    @classmethod
    def of(cls, model):
        """The contract of a Keras ViT, a `Classifier` or a `Runner`: whatever carries
        `image_size` (and, where it has them, `channels`, `class_names`, `image_mean`, `image_std`
        and the transform's `crop_pct`, `crop_mode`, `interpolation`)."""
        found = {field.name: getattr(model, field.name, None) for field in dataclasses.fields(cls)}
        found["transform"] = Transform.of(model)
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
        """Upright RGB pixels brought to `image_size` by the transform, float32 in [0, 255]."""
        return images.resize(pixels, self.image_size, self.transform)

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
        return pipeline.resize(image, self.image_size, self.transform)

    def resize_batch(self, pixels):
        """A batch `(n, h, w, channels)` of float pixels brought to `image_size` by the transform in
        Keras ops, for use inside a compiled step on any backend (the batch's size is static):
        the NumPy port's weights and 8-bit passes, multiplied in float32 (a sum on a half may
        round one step the other way)."""
        from keras import ops

        source = tuple(pixels.shape[1:3])
        (new_height, new_width), (top, left) = self.transform.plan(source, self.image_size)
        height, width = self.image_size
        kernel = images.KERNELS[self.transform.interpolation]

        def weights(size, new_size, start, length):
            fixed = images.filter_weights(size, new_size, kernel, start, length)
            return ops.convert_to_tensor((fixed / images.PRECISION).astype("float32"))

        def to_8_bits(values):
            return ops.clip(ops.floor(values + 0.5), 0.0, 255.0)

        if new_width != source[1]:
            pixels = to_8_bits(
                ops.einsum("vw,nhwc->nhvc", weights(source[1], new_width, left, width), pixels)
            )
        else:
            pixels = pixels[:, :, left : left + width]
        if new_height != source[0]:
            return to_8_bits(ops.einsum("uh,nhwc->nuwc", weights(source[0], new_height, top, height), pixels))
        return pixels[:, top : top + height]

    def description(self):
        """The contract in words and numbers, as runs (`preprocessing.json`) and export manifests
        record it."""
        resize = self.transform.describe(self.image_size)
        return {
            "input": f"{INPUT}, resized to image_size ({resize}); normalisation is inside the model",
            "input_range": [0, 255],
            "image_size": list(self.image_size),
            "resize": f"{resize}, to image_size",
            **self.transform.config(),
            "image_mean": self.image_mean,
            "image_std": self.image_std,
        }
