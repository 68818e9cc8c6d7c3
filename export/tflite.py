"""TFLite for phones and boards: fp32, fp16, dynamic-range int8 and full-integer int8.

Every variant has a static batch of 1 (XNNPACK keeps a static graph whole and
LiteRT.js needs it), takes RGB pixels in [0, 255] (float32, or uint8 for
full-integer int8 when asked) and returns float32 probabilities. Only builtin
ops are allowed: a Flex or custom op fails the export, naming the op.
"""

import logging
import tempfile

import keras
import numpy as np
import tensorflow as tf

from keras_vit import framework_logs
from keras_vit.data import pipeline
from keras_vit.model.attention import AttentionRollout

logger = logging.getLogger(__name__)

# The variants, in the order they are exported and reported.
VARIANTS = ("fp32", "fp16", "dynamic", "int8")


class UnsupportedOpError(ValueError):
    """The converted model needs an op outside TFLite's builtins (a Flex or custom op)."""


def _converter(classifier, folder, outputs=None):
    """A converter from a batch-1 SavedModel (Keras 3 models cannot go through from_keras_model).

    `outputs` maps images to a dict of output tensors; probabilities alone by default.
    """
    height, width = classifier.image_size
    spec = tf.TensorSpec([1, height, width, classifier.channels], tf.float32, name="images")
    archive = keras.export.ExportArchive()
    archive.track(classifier.model)
    outputs = outputs or (lambda images: {"probabilities": classifier.probabilities(images)})
    archive.add_endpoint("serving_default", outputs, [spec])
    archive.write_out(folder, verbose=False)
    return tf.lite.TFLiteConverter.from_saved_model(folder)


def convert_with_attention(classifier):
    """An fp32 model with two outputs: `probabilities` and `attention`, the attention-rollout
    map `(1, rows, cols)` from the [cls] token (`keras_vit.model.attention`), for apps that show
    where the model looked. The plain exports are unchanged.
    """
    rollout = AttentionRollout(classifier.model)
    with tempfile.TemporaryDirectory(prefix="keras-vit-tflite-") as folder:
        converter = _converter(classifier, folder, outputs=rollout)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.allow_custom_ops = False
        try:
            flatbuffer = converter.convert()
        except Exception as error:  # the converter raises its own ConverterError
            raise UnsupportedOpError(
                f"The attention TFLite conversion failed: {_first_lines(str(error))}"
            ) from None
    check_builtin_ops(flatbuffer)
    return flatbuffer


def convert(classifier, variant, representative_images=None, int8_input="uint8"):
    """Converts to one TFLite variant and returns the flatbuffer's bytes.

    Args:
        classifier: an `export.classifier.Classifier`.
        variant: one of `VARIANTS`.
        representative_images: float32 `(n, height, width, channels)` pixels
            from the training data; calibrates full-integer int8.
        int8_input: `"uint8"` (pixels as bytes, what camera pipelines give) or
            `"float32"` for the full-integer variant's input.

    Raises:
        UnsupportedOpError: the graph needs a Flex or custom op.
        ValueError: an unknown variant, or int8 without representative images.
    """
    if variant not in VARIANTS:
        raise ValueError(f"Unknown TFLite variant {variant!r}; choose from {', '.join(VARIANTS)}.")
    if int8_input not in ("uint8", "float32"):
        raise ValueError(f"int8_input must be 'uint8' or 'float32', got {int8_input!r}.")
    with tempfile.TemporaryDirectory(prefix="keras-vit-tflite-") as folder:
        converter = _converter(classifier, folder)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.allow_custom_ops = False
        if variant == "fp16":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.target_spec.supported_types = [tf.float16]
        elif variant == "dynamic":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        elif variant == "int8":
            if representative_images is None or len(representative_images) == 0:
                raise ValueError("Full-integer int8 needs representative images from the training data.")
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = lambda: (
                [image[None].astype(np.float32)] for image in representative_images
            )
            # Int8 kernels wherever TFLite has them; float builtins where it has none.
            converter.target_spec.supported_ops = [
                tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                tf.lite.OpsSet.TFLITE_BUILTINS,
            ]
            if int8_input == "uint8":
                converter.inference_input_type = tf.uint8
        try:
            with framework_logs.native_lines_muted():  # the calibrator prints "fully_quantize: 0, ..."
                flatbuffer = converter.convert()
        except Exception as error:  # the converter raises its own ConverterError
            message = str(error)
            if "Flex" in message or "custom op" in message or "not supported" in message:
                raise UnsupportedOpError(
                    f"The {variant} TFLite conversion needs ops outside TFLite's builtins: "
                    f"{_first_lines(message)}"
                ) from None
            raise
    check_builtin_ops(flatbuffer)
    return flatbuffer


def _first_lines(message, count=6):
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(lines[:count])


def operators(flatbuffer):
    """The op names a `.tflite` flatbuffer uses (custom ops by their custom name)."""
    from ai_edge_litert import schema_py_generated as schema

    names = {value: key for key, value in vars(schema.BuiltinOperator).items() if not key.startswith("_")}
    model = schema.Model.GetRootAs(flatbuffer, 0)
    used = set()
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == schema.BuiltinOperator.CUSTOM:
            used.add(code.CustomCode().decode())
        else:
            used.add(names.get(builtin, str(builtin)))
    return sorted(used)


def check_builtin_ops(flatbuffer):
    """Raises `UnsupportedOpError` naming any Flex or custom op in the flatbuffer."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(flatbuffer, 0)
    custom = sorted(
        {
            model.OperatorCodes(i).CustomCode().decode()
            for i in range(model.OperatorCodesLength())
            if model.OperatorCodes(i).CustomCode() is not None
        }
    )
    if custom:
        raise UnsupportedOpError(
            f"The TFLite model uses ops outside the builtins: {', '.join(custom)}. "
            f"keras-vit ships builtins only (Flex ops need the TensorFlow runtime on the device)."
        )


def representative_images(spec, image_size, count=200):
    """`count` training images (all of them, when there are fewer), decoded and resized as in
    training, for int8 calibration. `spec`: the run's `DatasetSpec`, whose validation split and
    seed leave out the images its verification holds out."""
    dataset, seed = spec.name, spec.seed
    split = spec.load()["train"]
    if len(split) < count:
        logger.info(
            "Calibrating int8 on the %d training images of %s (%d asked): the ranges it sets come "
            "from fewer images.", len(split), dataset, count,
        )  # fmt: skip
        count = len(split)
    batches = pipeline.training_batches(  # shuffled, so every class is represented
        split.to_dataset(), image_size=tuple(image_size), batch_size=count, seed=seed, cache=False
    )
    return next(iter(batches))["images"].numpy().astype("float32")
