"""Models and predictions for the desktop app, with no Qt: load any exported model, classify.

Everything the app shows about a model (class names, image size, normalisation)
comes from the model file through `keras_vit.inference.runtimes`; nothing is typed
here again.
"""

import csv
import dataclasses
import os
import time

from keras_vit.inference.runtimes import TOP_K, open_model, ranked
from keras_vit.storage.export_folder import ATTENTION_FILE
from keras_vit.storage.locate import locate


@dataclasses.dataclass
class Prediction:
    """One image's result.

    Attributes:
        top_k: `[(class_name, probability), ...]`, best first.
        milliseconds: inference time of the model alone (no decoding or resizing).
        attention: `(rows, cols)` attention-rollout map in [0, 1], or None.
        image: the decoded, upright RGB uint8 image that was classified.
    """

    top_k: list
    milliseconds: float
    attention: object = None
    image: object = None

    @property
    def top1(self):
        return self.top_k[0][0]


class LoadedModel:
    """An exported model ready to classify: `LoadedModel.open(path)`.

    Attributes:
        path, kind (`tflite`, `saved_model`, `keras`), image_size, class_names,
        attention_source (a description of where attention maps come from, or None).
    """

    def __init__(self, path, runner, attention_runner=None, attention_source=None):
        self.path = path
        self.runner = runner
        self.attention_runner = attention_runner
        self.attention_source = attention_source

    @property
    def kind(self):
        return self.runner.kind

    @property
    def image_size(self):
        return tuple(self.runner.image_size)

    @property
    def class_names(self):
        return list(self.runner.class_names)

    @property
    def has_attention(self):
        return self.attention_runner is not None

    @property
    def name(self):
        return os.path.basename(os.path.normpath(self.path))

    @classmethod
    def open(cls, path):
        """Opens a `.tflite`, SavedModel folder, `.keras` file or run folder.

        Raises:
            FileNotFoundError: nothing at `path`.
            ValueError: not a model, or not an image classifier (the message says which).
        """
        path = os.fspath(path)
        try:
            runner = open_model(path)
        except (FileNotFoundError, ValueError):
            raise
        except Exception as error:  # TensorFlow and LiteRT raise their own error types
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(f"{path} could not be loaded as a model ({first_line}).") from None
        if runner.image_size is None or len(runner.image_size) != 2 or not runner.class_names:
            raise ValueError(f"{path} is not an image classifier (no image input with class names).")
        if runner.has_attention:
            return cls(path, runner, runner, f"{runner.kind} model")
        sibling = locate(path).attention  # model_attention.tflite beside a .tflite, if there
        if runner.kind == "tflite" and sibling is not None:
            try:
                attention_runner = open_model(sibling)
            except ValueError:
                attention_runner = None
            if attention_runner is not None and list(attention_runner.class_names) == list(
                runner.class_names
            ):
                return cls(path, runner, attention_runner, ATTENTION_FILE)
        return cls(path, runner)

    def preprocess(self, image):
        """Upright RGB uint8 pixels -> the model's float32 input, by the model's input contract."""
        from keras_vit.data.contract import InputContract

        return InputContract.of(self.runner).resize(image)

    def classify(self, image, with_attention=True, top_k=TOP_K):
        """Classifies one RGB uint8 image; the attention map too when asked and available."""
        pixels = self.preprocess(image)[None]
        start = time.perf_counter()
        probabilities = self.runner.predict(pixels)[0]
        milliseconds = 1000 * (time.perf_counter() - start)
        attention = None
        if with_attention and self.has_attention:
            _, maps = self.attention_runner.predict_attention(pixels)
            attention = maps[0]
        return Prediction(
            top_k=[
                (name, probability) for name, _, probability in ranked(probabilities, self.class_names, top_k)
            ],
            milliseconds=milliseconds,
            attention=attention,
            image=image,
        )

    def classify_file(self, path, with_attention=True):
        """Reads and classifies one image file (any mode, EXIF-rotated, any size).

        Raises:
            FileNotFoundError, ValueError: the file is missing or not a readable image.
        """
        from keras_vit.data.images import load_image

        return self.classify(load_image(path), with_attention=with_attention)

    def describe(self):
        height, width = self.image_size
        runtime = {"tflite": "LiteRT", "saved_model": "TensorFlow", "keras": "Keras"}.get(
            self.kind, self.kind
        )
        return f"{self.name} · {runtime} · {height}x{width} · {len(self.class_names)} classes"


CSV_COLUMNS = ("file", "top1", "probability", "top5", "milliseconds", "error")


def csv_row(path, prediction=None, error=None):
    """One row of the folder table and its CSV, as a dict over `CSV_COLUMNS`."""
    if prediction is None:
        return {"file": path, "top1": "", "probability": "", "top5": "", "milliseconds": "", "error": error}
    return {
        "file": path,
        "top1": prediction.top1,
        "probability": round(prediction.top_k[0][1], 6),
        "top5": "; ".join(f"{name} {probability:.4f}" for name, probability in prediction.top_k),
        "milliseconds": round(prediction.milliseconds, 3),
        "error": "",
    }


def write_csv(rows, path):
    """Writes the folder results atomically (a temporary file, then renamed)."""
    from keras_vit.files import atomic_write

    def write(temporary):
        with open(temporary, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(os.fspath(path), write)
