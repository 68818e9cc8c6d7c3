"""One interface over every model file we make: `.keras`, SavedModel, `.tflite`, `.onnx`.

    runner = open_model("exports/vit/export-1/model_fp32.tflite")
    probabilities = runner.predict(images)  # float32 pixels in [0, 255]

Each runner reads the image size, class names and evaluation transform from the file itself (the
Keras config, the SavedModel's signature and labels, the TFLite metadata, the
ONNX metadata), never from a separate config.
"""

import json
import os
import re

import numpy as np

from keras_vit import framework_logs
from keras_vit.model import registry
from keras_vit.model.transform import DEFAULT, Transform
from keras_vit.storage.export_folder import LABELS_FILE, TRANSFORM_FILE
from keras_vit.storage.locate import locate

# How many classes an answer lists: `keras-vit predict`, the apps, the SavedModel's outputs.
TOP_K = 5


def ranked(probabilities, class_names=None, k=TOP_K):
    """One image's `k` most probable classes: `[(class name, index, probability)]`, best first."""
    order = np.argsort(-np.asarray(probabilities))[: min(k, len(probabilities))]
    return [(class_names[i] if class_names else str(i), int(i), float(probabilities[i])) for i in order]


def _to_numpy(tensor):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(tensor))


def _in_batches(run, images, batch_size=64):
    """`run` over `images` a batch at a time, outputs concatenated: bounded memory for any count."""
    return np.concatenate([run(images[i : i + batch_size]) for i in range(0, len(images), batch_size)])


class Runner:
    """Runs one exported model. Subclasses set `kind`, `image_size`, `class_names`, and
    `has_attention` where `predict_attention` gives attention-rollout maps too.
    `uses_tensorflow`: running it loads TensorFlow and Keras; a `.tflite` or `.onnx` needs
    neither, so its images are read with Pillow and NumPy (`keras_vit.data.images`)."""

    kind = ""
    uses_tensorflow = False
    image_size = None
    channels = 3
    class_names = None
    transform = DEFAULT  # how images are brought to image_size: read from the file where it says
    has_attention = False

    def predict(self, images):
        """Probabilities `(n, classes)` for float32 pixels `(n, height, width, 3)` in [0, 255]."""
        raise NotImplementedError

    def _checked(self, images):
        """`images` as float32 `(n, height, width, 3)` at this model's size, or a ValueError."""
        images = np.asarray(images, dtype=np.float32)
        height, width = self.image_size
        if images.ndim != 4 or images.shape[1:] != (height, width, self.channels):
            raise ValueError(
                f"This model takes images of shape (n, {height}, {width}, {self.channels}), "
                f"got {images.shape}; "
                f"resize them to {height}x{width} first (keras_vit.inference.predict.read_image does)."
            )
        return images


class KerasRunner(Runner):
    kind = "keras"
    uses_tensorflow = True

    def __init__(self, source):
        from keras_vit.inference.classifier import load_classifier

        self.classifier = load_classifier(source)
        self.image_size = self.classifier.image_size
        self.channels = self.classifier.channels
        self.class_names = self.classifier.class_names
        self.transform = self.classifier.transform
        self._probabilities = self._graph(self.classifier.probabilities)
        self._rollout = None
        # A ViT has a global attention map to roll out; a Swin's attention stays in its windows.
        family = registry.family_of(self.classifier.model, default=None)  # None: a user's own model
        self.has_attention = bool(family and family.has_attention_maps)

    def _graph(self, function):
        """`function` traced once into a TensorFlow graph for any batch size: calling a Keras
        model eagerly costs several times more per image (docs/benchmarks/history.md). On
        another Keras backend (a model trained with JAX, evaluated there) it runs as it is."""
        import keras
        import tensorflow as tf

        if keras.backend.backend() != "tensorflow":
            return function
        height, width = self.image_size
        spec = tf.TensorSpec([None, height, width, self.classifier.channels], tf.float32)
        return tf.function(function, input_signature=[spec])

    def predict(self, images, batch_size=64):
        return _in_batches(
            lambda batch: _to_numpy(self._probabilities(batch)), self._checked(images), batch_size
        )

    def predict_attention(self, images):
        """`(probabilities, attention-rollout maps (n, rows, cols))`, from the family's rollout."""
        if not self.has_attention:
            raise ValueError(
                f"A {self.classifier.model.family} model has no global attention map to roll out."
            )
        if self._rollout is None:
            model = self.classifier.model
            self._rollout = self._graph(registry.family_of(model).attention_rollout(model))
        outputs = self._rollout(self._checked(images))
        return tuple(_to_numpy(outputs[k]) for k in ("probabilities", "attention"))


class SavedModelRunner(Runner):
    kind = "saved_model"
    uses_tensorflow = True

    def __init__(self, path):
        loaded = _load_saved_model(path)
        if "serving_images" not in loaded.signatures:
            raise ValueError(f"{path} is a SavedModel, but not one from `keras-vit export`.")
        self._loaded = loaded  # keeps the signature's variables alive
        self._signature = loaded.signatures["serving_images"]
        self._bytes_signature = loaded.signatures["serving_default"]
        spec = self._signature.structured_input_signature[1]["images"]
        self.image_size = tuple(spec.shape[1:3])
        labels = os.path.join(path, "assets", LABELS_FILE)
        try:
            with open(labels, encoding="utf-8") as f:
                self.class_names = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{path} is a damaged SavedModel: {labels} cannot be read ({error}).") from None
        self.transform = Transform.of(_read_transform(os.path.join(path, "assets", TRANSFORM_FILE)))
        if len(self.class_names) != self._signature.structured_outputs["probabilities"].shape[-1]:
            raise ValueError(
                f"{path} is a damaged SavedModel: {labels} names {len(self.class_names)} classes, "
                f"and the model has {self._signature.structured_outputs['probabilities'].shape[-1]}."
            )

    def predict(self, images, batch_size=64):
        import tensorflow as tf

        def run(batch):
            return self._signature(images=tf.constant(batch))["probabilities"].numpy()

        return _in_batches(run, self._checked(images), batch_size)

    def predict_bytes(self, encoded_images):
        """What TF Serving runs for a REST request: encoded image bytes through `serving_default`."""
        import tensorflow as tf

        outputs = self._bytes_signature(image_bytes=tf.constant(list(encoded_images)))
        return {name: value.numpy() for name, value in outputs.items()}


def _read_transform(path):
    """A SavedModel's transform (its dict), or None for one exported before transforms."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} cannot be read ({error}): export the model again.") from None


def _load_saved_model(path):
    """`tf.saved_model.load`, with one line for a damaged folder (TensorFlow raises OSError,
    DataLossError, KeyError, IndexError... with pages of detail)."""
    import tensorflow as tf

    try:
        return tf.saved_model.load(path)
    except Exception as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        detail = lines[0] if lines else type(error).__name__
        detail = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", detail)
        raise ValueError(
            f"{path} is a damaged SavedModel ({detail[:200]}): export it again (`keras-vit export`)."
        ) from None


def xnnpack_delegation(interpreter):
    """`(ops XNNPACK took, ops left to LiteRT's own kernels, XNNPACK partitions)` of an allocated
    LiteRT `Interpreter`.

    LiteRT hands XNNPACK its partitions when the tensors are allocated and appends one DELEGATE
    node per partition; a partition's ops are those found walking back from the node's outputs
    to its inputs. An op outside runs on LiteRT's own kernels: for 16-bit integers, reference
    loops (docs/tflite-integer.md)."""
    ops = interpreter._get_ops_details()  # LiteRT's only view of the delegated graph
    original = [op for op in ops if op["op_name"] != "DELEGATE"]
    delegates = [op for op in ops if op["op_name"] == "DELEGATE"]
    producer = {int(t): op["index"] for op in original for t in op["outputs"]}
    taken = set()
    for node in delegates:
        inputs = {int(t) for t in node["inputs"]}
        stack = [int(t) for t in node["outputs"]]
        while stack:
            tensor = stack.pop()
            index = producer.get(tensor)
            if tensor in inputs or index is None or index in taken:
                continue
            taken.add(index)
            stack.extend(int(t) for t in ops[index]["inputs"] if t >= 0)
    return len(taken), len(original) - len(taken), len(delegates)


class TFLiteRunner(Runner):
    """Runs a `.tflite` with LiteRT, one image at a time.

    Public for the apps: `flatbuffer` (the file's bytes), `metadata` (`read_metadata`'s
    dict: name, description, labels, mean, std), `input_details` and `output_details`
    (LiteRT's, of the image input and the probabilities) and `input_count`.
    """

    kind = "tflite"

    def __init__(self, path, num_threads=None):
        from ai_edge_litert.interpreter import Interpreter

        from keras_vit.inference.tflite_metadata import read_metadata

        with open(path, "rb") as f:
            flatbuffer = f.read()
        if flatbuffer[4:8] != b"TFL3":
            raise ValueError(f"{path} is not a TFLite model (no TFL3 identifier); re-export it.")
        try:
            self.metadata = read_metadata(flatbuffer)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        self.class_names = self.metadata["labels"]
        self.transform = Transform.of(self.metadata["transform"])
        self.flatbuffer = flatbuffer
        try:
            self.interpreter = Interpreter(model_content=flatbuffer, num_threads=num_threads)
            with framework_logs.native_lines_muted():  # LiteRT's XNNPACK line
                self.interpreter.allocate_tensors()
        except (RuntimeError, ValueError) as error:
            first_line = str(error).strip().splitlines()[0]
            raise ValueError(f"{path} cannot run in LiteRT ({first_line}); re-export it.") from None
        self.input_count = len(self.interpreter.get_input_details())
        self.input_details = self.interpreter.get_input_details()[0]
        outputs = self.interpreter.get_output_details()
        # Probabilities are (1, classes); the attention model adds a (1, rows, cols) map.
        self.output_details = next((o for o in outputs if len(o["shape"]) == 2), None)
        if self.output_details is None or int(self.output_details["shape"][1]) != len(self.class_names):
            raise ValueError(f"{path} has no output of {len(self.class_names)} class probabilities.")
        self._attention = next((o for o in outputs if len(o["shape"]) == 3), None)
        self.has_attention = self._attention is not None
        self.image_size = tuple(int(d) for d in self.input_details["shape"][1:3])
        self.input_dtype = np.dtype(self.input_details["dtype"]).name

    def _to_input(self, image):
        mean = np.asarray(self.metadata["mean"], np.float32)
        std = np.asarray(self.metadata["std"], np.float32)
        image = (image - mean) / std  # the metadata's normalisation (identity for our exports)
        scale, zero_point = self.input_details["quantization"]
        if self.input_details["dtype"] == np.float32:
            return image[None].astype(np.float32)
        info = np.iinfo(self.input_details["dtype"])
        quantized = np.round(image / scale + zero_point) if scale else np.round(image)
        return np.clip(quantized, info.min, info.max).astype(self.input_details["dtype"])[None]

    def _run(self, image):
        self.interpreter.set_tensor(self.input_details["index"], self._to_input(image))
        self.interpreter.invoke()
        output = self.interpreter.get_tensor(self.output_details["index"])[0]
        scale, zero_point = self.output_details["quantization"]
        if self.output_details["dtype"] != np.float32:
            output = (output.astype(np.float32) - zero_point) * scale
        return output.astype(np.float32)

    def predict(self, images):
        # One image at a time: batch 1 is the static shape XNNPACK runs best.
        return np.stack([self._run(image) for image in self._checked(images)])

    def delegation(self):
        """`(ops XNNPACK took, ops outside it, XNNPACK partitions)`: `xnnpack_delegation`."""
        return xnnpack_delegation(self.interpreter)

    def predict_attention(self, images):
        """`(probabilities, attention maps (n, rows, cols))`; needs a model exported with --attention."""
        if not self.has_attention:
            raise ValueError(
                "This .tflite has no attention output; export with `keras-vit export --attention`."
            )
        probabilities, maps = [], []
        for image in self._checked(images):
            probabilities.append(self._run(image))
            maps.append(self.interpreter.get_tensor(self._attention["index"])[0].astype(np.float32))
        return np.stack(probabilities), np.stack(maps)


class OnnxRunner(Runner):
    kind = "onnx"

    def __init__(self, path):
        import onnxruntime

        try:
            self.session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime raises its own untyped errors
            raise ValueError(f"{path} is not a readable ONNX model ({str(error).splitlines()[0]}).") from None
        meta = self.session.get_modelmeta().custom_metadata_map
        shape = self.session.get_inputs()[0].shape
        self.image_size = (int(shape[1]), int(shape[2]))
        self.class_names = meta["class_names"].split("\n") if "class_names" in meta else None
        self.transform = Transform.of(json.loads(meta[TRANSFORM_FILE]) if TRANSFORM_FILE in meta else None)

    def predict(self, images, batch_size=64):
        return _in_batches(
            lambda batch: self.session.run(None, {"images": batch})[0], self._checked(images), batch_size
        )


def open_model(path):
    """A `Runner` for a `.keras` file, run folder, SavedModel folder, `.tflite` or `.onnx`.

    Raises:
        FileNotFoundError: nothing at `path`.
        ValueError: not a model file we can run.
    """
    runner, source = _runner_for(os.fspath(path))
    return runner(source)


def needs_tensorflow(path):
    """Whether running the model at `path` loads TensorFlow and Keras: a `.keras` file, run
    folder or SavedModel does; a `.tflite` (an export folder's too) or `.onnx` does not, so
    `keras-vit predict` on one starts in a fraction of a second. False for what `open_model`
    refuses, whose error needs no framework either."""
    try:
        runner, _ = _runner_for(os.fspath(path))
    except (FileNotFoundError, ValueError):
        return False
    return runner.uses_tensorflow


def _runner_for(path):
    """(the `Runner` class for `path`, the path it opens)."""
    located = locate(path)
    runners = {
        "keras": KerasRunner,
        "pretrained": KerasRunner,
        "saved_model": SavedModelRunner,
        "tflite": TFLiteRunner,
        "onnx": OnnxRunner,
    }
    if located.kind not in runners:
        raise ValueError(
            f"{path} is a {located.kind}, not a model keras-vit runs: fine-tune from it with "
            f"`keras-vit train --weights {path}`."
        )
    return runners[located.kind], located.path
