"""Running a trained or exported model: any model file as a `Runner` (`.keras`, SavedModel,
`.tflite`, `.onnx`), `predict`, `evaluate`, and the `.tflite` metadata reader."""
