"""ONNX export through tf2onnx, for runtimes outside the TensorFlow family (ONNX Runtime, TensorRT)."""

import json

import numpy as np
import tensorflow as tf

from keras_vit.storage.export_folder import TRANSFORM_FILE

OPSET = 17


def _erfc(ctx, node, name, args):
    """erfc(x) = 1 - erf(x): TF lowers exact GELU to Erfc, which ONNX and tf2onnx lack."""
    import tf2onnx

    erf = ctx.make_node("Erf", [node.input[0]], op_name_scope=node.name)
    one = ctx.make_const(tf2onnx.utils.make_name("one"), np.array(1.0, np.float32))
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])
    node.type = "Sub"


def convert(classifier):
    """Returns the ONNX model's bytes: `images` (batch, H, W, C) pixels in [0, 255] -> `probabilities`."""
    try:
        import tf2onnx
    except ImportError:
        raise ValueError("ONNX export needs tf2onnx and onnx: pip install 'keras-vit[export]'.") from None
    height, width = classifier.image_size
    spec = tf.TensorSpec([None, height, width, classifier.channels], tf.float32, name="images")

    @tf.function(input_signature=[spec])
    def probabilities(images):
        return {"probabilities": classifier.probabilities(images)}

    proto, _ = tf2onnx.convert.from_function(
        probabilities, input_signature=[spec], opset=OPSET, custom_op_handlers={"Erfc": (_erfc, [])}
    )
    proto.doc_string = f"{classifier.name}: RGB pixels in [0, 255] -> class probabilities"
    entry = proto.metadata_props.add()
    entry.key, entry.value = "class_names", "\n".join(classifier.class_names)
    entry = proto.metadata_props.add()
    entry.key, entry.value = TRANSFORM_FILE, json.dumps(classifier.transform.config())
    return proto.SerializeToString()
