"""ONNX export through tf2onnx, for runtimes outside the TensorFlow family (ONNX Runtime, TensorRT).

An ONNX file is one protobuf, which cannot exceed 2 GiB. A larger model (ViT-H and up in float32)
is written with external data: the graph in `model.onnx`, its weights in `model.onnx.data` beside
it, which ONNX Runtime reads from the model's folder.
"""

import contextlib
import json
import logging
import os

import numpy as np
import tensorflow as tf

from keras_vit.files import write_bytes
from keras_vit.storage.export_folder import TRANSFORM_FILE

logger = logging.getLogger(__name__)

OPSET = 17
# tf2onnx's switch (`tf2onnx.constants.ENV_TF2ONNX_CATCH_ERRORS`), read at each conversion.
CATCH_ERRORS = "TF2ONNX_CATCH_ERRORS"
# Weights go into the external data file at offsets of this multiple, so a runtime can map them.
EXTERNAL_DATA_ALIGNMENT = 4096


def _erfc(ctx, node, name, args):
    """erfc(x) = 1 - erf(x): TF lowers exact GELU to Erfc, which ONNX and tf2onnx lack."""
    import tf2onnx

    erf = ctx.make_node("Erf", [node.input[0]], op_name_scope=node.name)
    one = ctx.make_const(tf2onnx.utils.make_name("one"), np.array(1.0, np.float32))
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])
    node.type = "Sub"


def data_file(path):
    """The external data file of the ONNX model at `path`: `model.onnx.data` for `model.onnx`."""
    return f"{os.fspath(path)}.data"


def _to_onnx(classifier, large_model):
    """(the ONNX model proto, tf2onnx's external tensor storage or None)."""
    try:
        import tf2onnx
    except ImportError:
        raise ValueError("ONNX export needs tf2onnx and onnx: pip install 'keras-vit[export]'.") from None
    height, width = classifier.image_size
    spec = tf.TensorSpec([None, height, width, classifier.channels], tf.float32, name="images")

    @tf.function(input_signature=[spec])
    def probabilities(images):
        return {"probabilities": classifier.probabilities(images)}

    def from_function():
        return tf2onnx.convert.from_function(
            probabilities,
            input_signature=[spec],
            opset=OPSET,
            custom_op_handlers={"Erfc": (_erfc, [])},
            large_model=large_model,
        )

    if large_model:  # tf2onnx optimizes a large model in place already
        with _numpy_product():
            proto, storage = from_function()
    else:
        try:
            with _optimizers_in_place():
                proto, storage = from_function()
        except Exception as error:  # an optimizer that tf2onnx's default would have skipped
            logger.info("tf2onnx's optimizers failed in place (%s): converting with each on a copy", error)
            proto, storage = from_function()
    proto.doc_string = f"{classifier.name}: RGB pixels in [0, 255] -> class probabilities"
    entry = proto.metadata_props.add()
    entry.key, entry.value = "class_names", "\n".join(classifier.class_names)
    entry = proto.metadata_props.add()
    entry.key, entry.value = TRANSFORM_FILE, json.dumps(classifier.transform.config())
    if classifier.license:
        entry = proto.metadata_props.add()
        entry.key, entry.value = "license", classifier.license
    return proto, storage


@contextlib.contextmanager
def _optimizers_in_place():
    """tf2onnx's graph optimizers run on the graph itself, as for a large model, not each on a deep
    copy of it (its default below 2 GiB, so that a failing optimizer can be skipped): the copies
    were 40% of a ViT-Ti's conversion. A failure raises; `_to_onnx` then converts the default way."""
    saved = os.environ.get(CATCH_ERRORS)
    if saved is not None:  # the user's own choice
        yield
        return
    os.environ[CATCH_ERRORS] = "FALSE"
    try:
        yield
    finally:
        del os.environ[CATCH_ERRORS]


@contextlib.contextmanager
def _numpy_product():
    """tf2onnx 1.17's large-model path calls `np.product`, which NumPy 2 removed: lent for the call."""
    if hasattr(np, "product"):
        yield
        return
    np.product = np.prod
    try:
        yield
    finally:
        del np.product


def convert(classifier):
    """Returns the ONNX model's bytes: `images` (batch, H, W, C) pixels in [0, 255] -> `probabilities`."""
    proto, _ = _to_onnx(classifier, large_model=False)
    return proto.SerializeToString()


def write(classifier, path, external_data=False):
    """Writes the ONNX model to `path`; returns the files written.

    With `external_data`, the weights go to `data_file(path)` beside it (ONNX's external data,
    offsets aligned to `EXTERNAL_DATA_ALIGNMENT`) and `path` holds the graph alone, so a model
    over protobuf's 2 GiB is written whole.
    """
    if not external_data:
        write_bytes(path, convert(classifier))
        return [path]
    import onnx
    from onnx.external_data_helper import _get_all_tensors

    proto, storage = _to_onnx(classifier, large_model=True)
    data_path = data_file(path)
    offset = 0
    with open(data_path, "wb") as data:
        for tensor in _get_all_tensors(proto):
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            key = {entry.key: entry.value for entry in tensor.external_data}["location"]
            blob = storage.name_to_tensor_data.pop(key)  # freed as written: the weights are held once
            padding = -offset % EXTERNAL_DATA_ALIGNMENT
            data.write(b"\0" * padding)
            offset += padding
            data.write(blob)
            del tensor.external_data[:]
            where = {"location": os.path.basename(data_path), "offset": offset, "length": len(blob)}
            for field, value in where.items():
                entry = tensor.external_data.add()
                entry.key, entry.value = field, str(value)
            offset += len(blob)
    write_bytes(path, proto.SerializeToString())
    return [path, data_path]
