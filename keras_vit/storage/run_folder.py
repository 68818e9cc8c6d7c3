"""A training run's folder: the files `keras-vit train` writes there, and the one way to read them.

    model.keras        the best model by validation accuracy (class names and
                       normalisation inside), written atomically
    class_names.json   the labels, in output order (for people and tools without Keras;
                       a resumed run checks its dataset against it)
    preprocessing.json image size, mean and std: what the model expects (idem)
    history.json       the run's settings, per-epoch metrics and the final ones
    training.png       the training curves
    log.csv, logs/     a CSV log and TensorBoard logs
    backup/            the mid-epoch backup a killed run resumes from

Every reader of a run (`evaluate`, `export`, `verify`, the benchmarks) goes
through `RunFolder`, and every reader of "which images were held out" through
`DatasetSpec`.
"""

import dataclasses
import os

from keras_vit.data import datasets
from keras_vit.files import read_json

MODEL_FILE = "model.keras"
HISTORY_FILE = "history.json"
CLASS_NAMES_FILE = "class_names.json"
PREPROCESSING_FILE = "preprocessing.json"
CURVES_FILE = "training.png"
LOG_FILE = "log.csv"
TENSORBOARD_FOLDER = "logs"
BACKUP_FOLDER = "backup"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Which dataset a model was trained on and how its validation split was carved.

    The same name, split and seed give the same held-out images, so a model is
    evaluated and its exports verified on images it never trained on.
    """

    name: str | None = None  # None: unknown (a `.keras` file outside a run folder)
    validation_split: float = datasets.VALIDATION_SPLIT
    seed: int = datasets.SEED

    @classmethod
    def from_record(cls, record):
        """The spec a run's settings or an export's manifest recorded (keys `dataset`,
        `validation_split`, `seed`); what is missing takes the defaults."""
        defaults = cls()
        return cls(
            name=record.get("dataset"),
            validation_split=record.get("validation_split", defaults.validation_split),
            seed=record.get("seed", defaults.seed),
        )

    def with_name(self, name):
        """This spec on dataset `name` instead, when one is given (a flag wins over the run)."""
        return self if name is None else dataclasses.replace(self, name=os.fspath(name))

    def load(self):
        if self.name is None:
            raise ValueError(
                "The dataset is unknown: pass --dataset (a folder, .zip, tfds name or cifar10-mini)."
            )
        return datasets.load_dataset(self.name, validation_split=self.validation_split, seed=self.seed)

    def held_out(self, split=None):
        """`(dataset, split name)`: `split`, else the test split when there is one, else validation."""
        dataset = self.load()
        split = split or ("test" if "test" in dataset.splits else "validation")
        if not len(dataset[split]):
            raise ValueError(
                f"{self.name} has no held-out images here (no test/ or val/ folder, and the run held "
                f"out none: --validation-split {self.validation_split:g}): pass --dataset a folder whose "
                f"val/ or test/ folder holds other images of the same classes."
            )
        return dataset, split


class RunFolder:
    """A run folder (it need not exist yet: `train` makes it)."""

    def __init__(self, path):
        self.path = os.fspath(path)

    def file(self, name):
        return os.path.join(self.path, name)

    @property
    def model_file(self):
        return self.file(MODEL_FILE)

    @property
    def finished(self):
        """Whether training ended here (it writes history.json last)."""
        return os.path.exists(self.file(HISTORY_FILE))

    def description(self):
        """`(class names, preprocessing)` as the run recorded them when it started; None before."""
        if not os.path.exists(self.file(CLASS_NAMES_FILE)):
            return None
        class_names = read_json(self.file(CLASS_NAMES_FILE), list)
        preprocessing = {}
        if os.path.exists(self.file(PREPROCESSING_FILE)):
            preprocessing = read_json(self.file(PREPROCESSING_FILE))
        return class_names, preprocessing

    def summary(self):
        """history.json: the run's `config`, `history` and `final` metrics; {} before the run ends."""
        if not self.finished:
            return {}
        return read_json(self.file(HISTORY_FILE))

    def settings(self):
        """The run's TrainConfig as a dict; {} for a folder with no finished run."""
        return self.summary().get("config", {})

    def dataset_spec(self):
        """The run's `DatasetSpec`; an unknown dataset outside a finished run."""
        return DatasetSpec.from_record(self.settings())
