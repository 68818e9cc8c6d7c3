"""TFLite model metadata in the format MediaPipe Tasks and the LiteRT support libraries read.

MediaPipe's `ImageClassifier` (Android, iOS, web, Python) needs, inside the
`.tflite`: the input's normalisation (for float input), its colour space, and a
label file on the output tensor. The writer in the mediapipe wheel imports a
compiled module the wheel lacks, and tflite-support pins protobuf<4, so this
module builds the metadata from MediaPipe's pure-Python schema with
`flatbuffers`, as the format specifies:

  - a `ModelMetadata` flatbuffer (file identifier `M001`) in a model buffer
    named `TFLITE_METADATA`;
  - the label file appended to the `.tflite` as a ZIP archive (the flatbuffer
    is the archive's preamble, so the file stays a valid model).

Our models normalise inside the graph and take RGB pixels in [0, 255], so the
metadata's normalisation is the identity (mean 0, std 1): readers apply it and
hand the model raw pixels. `keras_vit.inference.tflite_metadata` reads it back.
"""

import io
import json
import zipfile

import flatbuffers

from keras_vit.inference.tflite_metadata import METADATA_NAME, schemas
from keras_vit.storage.export_folder import LABELS_FILE, TRANSFORM_FILE

# The second output of the attention model (`keras-vit export --attention`).
ATTENTION_OUTPUT = "attention"
# The oldest metadata parser that reads every field written here (all from 1.0.0).
MIN_PARSER_VERSION = "1.0.0"


def _model_metadata(classifier, input_is_uint8, description, output_ranks=(2,)):
    fb, _ = schemas()
    height, width = classifier.image_size

    image = fb.TensorMetadataT()
    image.name = "image"
    image.description = f"RGB image, {height}x{width}, pixels in [0, 255]" + (
        " (uint8)." if input_is_uint8 else " (float32); the model normalises inside."
    )
    image.content = fb.ContentT()
    image.content.contentPropertiesType = fb.ContentProperties.ImageProperties
    image.content.contentProperties = fb.ImagePropertiesT()
    image.content.contentProperties.colorSpace = fb.ColorSpaceType.RGB
    if not input_is_uint8:
        # Required by MediaPipe for float input. Identity: the graph normalises itself.
        normalization = fb.ProcessUnitT()
        normalization.optionsType = fb.ProcessUnitOptions.NormalizationOptions
        normalization.options = fb.NormalizationOptionsT()
        normalization.options.mean = [0.0]
        normalization.options.std = [1.0]
        image.processUnits = [normalization]
    image.stats = fb.StatsT()
    image.stats.min = [0.0]
    image.stats.max = [255.0]
    transform = fb.AssociatedFileT()
    transform.name = TRANSFORM_FILE
    transform.description = (
        f"How an image is brought to {height}x{width}: {classifier.transform.describe((height, width))} "
        "(crop_pct, crop_mode, interpolation: timm's evaluation transform; Pillow's 8-bit passes)."
    )
    transform.type = fb.AssociatedFileType.UNKNOWN
    image.associatedFiles = [transform]

    labels = fb.AssociatedFileT()
    labels.name = LABELS_FILE
    labels.description = "The class names, one per line, in output order."
    labels.type = fb.AssociatedFileType.TENSOR_AXIS_LABELS

    probability = _unit_feature(fb, "probability", f"Probabilities of the {classifier.num_classes} classes.")
    probability.associatedFiles = [labels]

    subgraph = fb.SubGraphMetadataT()
    subgraph.inputTensorMetadata = [image]
    # One entry per output, in the subgraph's order: probabilities (rank 2) and, in
    # the attention model, the rollout map (rank 3).
    subgraph.outputTensorMetadata = [
        probability if rank == 2 else _attention_metadata(fb, classifier) for rank in output_ranks
    ]

    model = fb.ModelMetadataT()
    model.name = classifier.name
    model.description = description
    model.version = _version()
    model.author = "keras-vit"
    if classifier.license:  # the weights' licence (MediaPipe's ModelMetadata has the field)
        model.license = classifier.license
    model.subgraphMetadata = [subgraph]
    model.minParserVersion = MIN_PARSER_VERSION
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), b"M001")
    return bytes(builder.Output())


def _attention_metadata(fb, classifier):
    from keras_vit.model import registry

    rows, cols = registry.family_of(classifier.model).attention_grid(classifier.model)
    return _unit_feature(
        fb,
        ATTENTION_OUTPUT,
        f"Attention rollout from the [cls] token over the {rows}x{cols} patch grid; largest value 1.",
    )


def _unit_feature(fb, name, description):
    """Metadata of a float output with values in [0, 1]."""
    tensor = fb.TensorMetadataT()
    tensor.name = name
    tensor.description = description
    tensor.content = fb.ContentT()
    tensor.content.contentPropertiesType = fb.ContentProperties.FeatureProperties
    tensor.content.contentProperties = fb.FeaturePropertiesT()
    tensor.stats = fb.StatsT()
    tensor.stats.min = [0.0]
    tensor.stats.max = [1.0]
    return tensor


def _version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"keras-vit {version('keras-vit')}"
    except PackageNotFoundError:
        return "keras-vit"


def _inline_buffers(model, flatbuffer):
    """Moves weights stored after the flatbuffer (by offset, as ai-edge-quantizer writes them) into
    the flatbuffer itself: repacking would otherwise leave their offsets pointing past the end."""
    for buffer in model.buffers:
        if buffer.offset and buffer.offset > 1:
            buffer.data = bytearray(flatbuffer[buffer.offset : buffer.offset + buffer.size])
            buffer.offset, buffer.size = 0, 0


def add_metadata(flatbuffer, classifier, description=""):
    """Returns the `.tflite` bytes with metadata and the label file attached."""
    _, schema = schemas()
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(flatbuffer, 0))
    _inline_buffers(model, flatbuffer)
    graph = model.subgraphs[0]
    input_type = graph.tensors[graph.inputs[0]].type
    output_ranks = [len(graph.tensors[i].shape) for i in graph.outputs]
    metadata_buffer = schema.BufferT()
    metadata_buffer.data = _model_metadata(
        classifier, input_type == schema.TensorType.UINT8, description, output_ranks
    )
    model.buffers.append(metadata_buffer)
    entry = schema.MetadataT()
    entry.name = METADATA_NAME
    entry.buffer = len(model.buffers) - 1
    model.metadata = [m for m in (model.metadata or []) if m.name != METADATA_NAME.encode()] + [entry]
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), b"TFL3")

    packed = io.BytesIO(bytes(builder.Output()))
    packed.seek(0, io.SEEK_END)
    # Appending to a non-ZIP file makes the file the archive's preamble; offsets stay absolute.
    with zipfile.ZipFile(packed, "a", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(LABELS_FILE, "".join(f"{name}\n" for name in classifier.class_names))
        archive.writestr(TRANSFORM_FILE, json.dumps(classifier.transform.config()))
    return packed.getvalue()
