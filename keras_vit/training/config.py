"""`TrainConfig`: every setting of a training run, resolved from flag, preset and default.

`keras-vit train` flags map one to one onto its fields; `resolved()` fills what
the user left unset from the preset (`recipes.PRESETS`), else from
`recipes.DEFAULTS`, and validates the result before anything is built.
"""

import dataclasses
import os

from keras_vit.data.datasets import DATASET, SEED
from keras_vit.model import configs
from keras_vit.training.recipes import DEFAULTS, PRECISIONS, PRESETS, STRATEGIES


@dataclasses.dataclass
class TrainConfig:
    """Everything a run needs; `keras-vit train` flags map one to one.

    A setting left None comes from the preset (`recipes.PRESETS`), else from
    `recipes.DEFAULTS`: `resolved()` fills them in.
    """

    dataset: str = DATASET
    model: str | None = None
    output: str = "runs/latest"
    preset: str = "scratch"
    epochs: int | None = None
    batch_size: int | None = None
    learning_rate: float | None = None
    weight_decay: float | None = None
    warmup_epochs: float | None = None
    label_smoothing: float | None = None
    clipnorm: float = 1.0
    dropout: float = 0.0
    drop_path_rate: float | None = None
    image_size: int | None = None
    validation_split: float | None = None
    crop: str | None = None
    crop_min_scale: float | None = None
    flip: bool = True
    randaugment: int | None = None
    mixup: float | None = None
    cutmix: float | None = None
    random_erasing: float | None = None
    repeated_augmentation: int | None = None
    ema: float | None = None  # momentum of the weights' moving average; 0 is off
    layer_decay: float | None = None  # layer-wise learning-rate decay; 1 is off
    precision: str | None = None
    jit_compile: bool = True
    strategy: str = "auto"
    weights: str | None = None
    teacher: str | None = None  # a model file whose top class the distillation head learns (DeiT)
    distillation_weight: float | None = None  # the distillation head's share of the loss
    freeze_backbone: bool = False
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
    seed: int = SEED
    backup_every_steps: int = 100
    steps_per_epoch: int | None = None
    overrides: dict = dataclasses.field(default_factory=dict)  # more create_model arguments

    def validate(self):
        """Raises ValueError for a setting no run can use; call it on a `resolved()` config."""
        self._check_choices()
        self._check_numbers()
        self._check_image_size()
        self._check_starting_points()
        self._check_overrides()

    def _check_choices(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"Unknown strategy {self.strategy!r}; strategies: {', '.join(STRATEGIES)}.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"Unknown precision {self.precision!r}; choose {', '.join(PRECISIONS)}.")

    def _check_numbers(self):
        counts = ("epochs", "batch_size", "backup_every_steps", "repeated_augmentation", "image_size")
        for name in counts + ("steps_per_epoch",):  # steps_per_epoch: None is the whole dataset
            value = getattr(self, name)
            if (value is not None or name in counts) and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}.")
        for name in ("dropout", "drop_path_rate", "validation_split"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} is a fraction in [0, 1), got {getattr(self, name)}.")
        not_negative = ("learning_rate", "weight_decay", "warmup_epochs", "label_smoothing", "clipnorm")
        for name in not_negative + ("randaugment", "mixup", "cutmix", "random_erasing"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}.")
        if self.learning_rate == 0:
            raise ValueError("learning_rate must be positive.")
        if self.random_erasing > 1:
            raise ValueError(f"random_erasing is a probability in [0, 1], got {self.random_erasing}.")
        if not 0 < self.layer_decay <= 1:
            raise ValueError(f"layer_decay is a factor in (0, 1] (1 is off), got {self.layer_decay}.")
        if not 0 <= self.distillation_weight <= 1:
            raise ValueError(f"distillation_weight is in [0, 1], got {self.distillation_weight}.")
        if not 0 <= self.ema < 1:
            raise ValueError(f"ema is a momentum in [0, 1) (0 is off), got {self.ema}.")
        if not 0 < self.crop_min_scale <= 1:
            raise ValueError(
                f"crop_min_scale is a fraction of the area in (0, 1], got {self.crop_min_scale}."
            )

    def _check_image_size(self):
        patch = self.overrides.get("patch_size", configs.get_model_config(self.model)["patch_size"])
        if self.image_size % patch:
            sizes = sorted(
                {max(patch, self.image_size // patch * patch), (self.image_size // patch + 1) * patch}
            )
            raise ValueError(
                f"image_size {self.image_size} is not a multiple of {self.model}'s patch size {patch}: "
                f"choose {' or '.join(map(str, sizes))}."
            )

    def _check_starting_points(self):
        """`--weights` and `--teacher`, before anything is built."""
        if self.weights:
            from keras_vit.training.initial_weights import check_source

            check_source(self.weights)
        if self.teacher and not os.path.exists(self.teacher):
            raise FileNotFoundError(f"Teacher not found: {self.teacher} (--teacher takes a model file).")
        if self.teacher and not {**configs.get_model_config(self.model), **self.overrides}.get(
            "distillation_token"
        ):
            raise ValueError(
                f"--teacher trains a distilled student, and {self.model} has no distillation token: "
                f"use a deit_*_distilled_* model or --override distillation_token=true."
            )

    def _check_overrides(self):
        # These come from their own settings or from the dataset; an override would disagree.
        owned = {"num_classes", "class_names", "image_size", "dropout", "drop_path_rate"}
        owned |= {"image_mean", "image_std", "dtype", "name"}
        clash = sorted(owned & set(self.overrides))
        if clash:
            raise ValueError(
                f"--override cannot set {clash}: use the matching flag (e.g. --image-size, --precision) "
                f"or let the dataset decide (classes)."
            )

    def resolved(self):
        """This config with every setting left None taken from the preset, else from
        `recipes.DEFAULTS`; validated."""
        if self.preset not in PRESETS:
            raise ValueError(f"Unknown preset {self.preset!r}; presets: {', '.join(sorted(PRESETS))}.")
        values = dataclasses.asdict(self)
        for source in (PRESETS[self.preset], DEFAULTS):
            for key, value in source.items():
                if values.get(key) is None:
                    values[key] = value
        if values["image_size"] is None:
            values["image_size"] = configs.get_model_config(values["model"])["image_size"]
        if values["crop"] is None:  # (a bad image_size is refused by validate)
            values["crop"] = "pad" if values["image_size"] <= 64 else "resized"
        config = TrainConfig(**values)
        config.validate()
        return config
