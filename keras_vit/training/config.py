"""`TrainConfig`: every setting of a training run, resolved from flag, preset and default.

`keras-vit train` flags map one to one onto its fields; `resolved()` fills what
the user left unset from the preset (`recipes.PRESETS`), else from
`recipes.DEFAULTS`, and validates the result before anything is built.
"""

import dataclasses
import os

from keras_vit.data.datasets import DATASET, SEED
from keras_vit.model import registry
from keras_vit.model.checks import nearest_sizes
from keras_vit.model.transform import DEFAULT_MEAN, DEFAULT_STD
from keras_vit.training.lora import DEFAULT_TARGETS as DEFAULT_LORA_TARGETS
from keras_vit.training.lora import check_targets as check_lora_targets
from keras_vit.training.recipes import DEFAULTS, PAD_CROP_MAX_SIZE, PRECISIONS, PRESETS, STRATEGIES


def setting(help, default=None, *, flag=True, **flag_options):
    """A `TrainConfig` field: its default (None: the preset's, else `recipes.DEFAULTS`'), and the
    help and argparse options of its `keras-vit train` flag, which the CLI builds from these."""
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, **flag_options})


@dataclasses.dataclass
class TrainConfig:
    """Everything a run needs; `keras-vit train` flags map one to one, help texts included.

    A setting left None comes from the preset (`recipes.PRESETS`), else from
    `recipes.DEFAULTS`: `resolved()` fills them in.
    """

    dataset: str = setting(
        "an image folder or .zip of class_name/image files, a tensorflow-datasets name, or cifar10-mini",
        DATASET,
    )
    model: str | None = setting("a name from `keras-vit models`")
    output: str = setting("the run folder; rerun the same command to resume", "runs/latest")
    preset: str | None = setting(
        "the recipe for every setting not given: scratch, finetune, or small-scratch (a plain ViT from "
        "scratch on CIFAR-10; see docs/benchmarks/cifar10.md)",
        choices=sorted(PRESETS),
        default_text="finetune with --weights, else scratch",
    )
    epochs: int | None = setting("passes over the training images")
    batch_size: int | None = setting("the global batch, split over replicas")
    learning_rate: float | None = setting("peak learning rate after warmup")
    weight_decay: float | None = setting("AdamW's decoupled weight decay")
    warmup_epochs: float | None = setting("linear warmup before the cosine decay")
    label_smoothing: float | None = setting("of the cross-entropy targets")
    clipnorm: float = setting("global gradient norm clip; 0 turns it off", 1.0)
    dropout: float = setting("on embeddings, attention output and MLPs", 0.0)
    drop_path_rate: float | None = setting("stochastic depth of the last block")
    image_size: int | None = setting(
        "train at this resolution (position embeddings are resampled)", default_text="the model's"
    )
    validation_split: float | None = setting("held out from train when there is no val/ folder")
    crop: str | None = setting(
        "random crop",
        choices=("resized", "pad", "none"),
        default_text=f"pad up to {PAD_CROP_MAX_SIZE} px, else resized",
    )
    crop_min_scale: float | None = setting("smallest area a resized crop keeps")
    flip: bool = setting("random horizontal flips", True)
    randaugment: int | None = setting("RandAugment operations per image; 0 is off")
    mixup: float | None = setting("MixUp alpha; 0 is off")
    cutmix: float | None = setting("CutMix alpha; 0 is off")
    random_erasing: float | None = setting("RandomErasing probability per image; 0 is off")
    repeated_augmentation: int | None = setting(
        "each image K times per batch, augmented apart (DeiT); 1 is off", metavar="K"
    )
    ema: float | None = setting(
        "validate, save and export a moving average of the weights with momentum M (e.g. 0.9998); 0 is off",
        metavar="M",
    )
    layer_decay: float | None = setting(
        "layer-wise learning-rate decay for fine-tuning (e.g. 0.65): block i of N gets lr * D^(N - i), "
        "the patch embedding lr * D^(N + 1), the head lr; 1 is off",
        metavar="D",
    )
    precision: str | None = setting("float32 or mixed precision", choices=PRECISIONS)
    jit_compile: bool = setting("XLA", True)
    strategy: str = setting(
        "auto: all GPUs mirrored, else one device; multi-worker: TF_CONFIG on TensorFlow, Keras' "
        "KERAS_DISTRIBUTION_* variables on JAX; model-parallel (JAX): weights sharded over devices",
        "auto",
        choices=STRATEGIES,
    )
    model_parallel: int = setting(
        "with --strategy model-parallel, the devices each sharded weight is split over (the rest "
        "split the batch)",
        2,
        metavar="N",
    )
    lora_rank: int | None = setting(
        "LoRA: train rank-R adapters (and the head) with the rest of the model frozen; model.keras "
        "is saved with them merged",
        metavar="R",
        default_text="off",
    )
    lora_targets: str = setting(
        "with --lora-rank, the layers of each block it adapts: attention, mlp, or attention,mlp",
        ",".join(DEFAULT_LORA_TARGETS),
    )
    remat: bool = setting(
        "recompute each block's activations in the backward pass: less memory, more compute", False
    )
    weights: str | None = setting(
        "pretrained weights to start from: a timm/Hugging Face (.safetensors, .pth, .bin) or Google "
        "(.npz) checkpoint, or another run's model (.keras or run folder)"
    )
    teacher: str | None = setting(
        "DeiT distillation: any model file `keras-vit predict` runs, trained on the same classes; the "
        "student (a deit_*_distilled_* model, or --override distillation_token=true) learns its top class "
        "through the distillation token"
    )
    distillation_weight: float | None = setting(
        "the distillation head's share of the loss with --teacher (DeiT's hard distillation)", metavar="W"
    )
    freeze_backbone: bool = setting("train the head only (linear probe)", False)
    freeze_blocks: int = setting(
        "partial fine-tuning: the stem and the first N blocks keep their starting weights, the later "
        "blocks and the head train (fewer gradients: faster steps); 0 is off",
        0,
        metavar="N",
    )
    early_stopping: int | None = setting(
        "stop after N epochs without a better validation accuracy (the saved model is the best epoch's)",
        metavar="N",
        default_text="off",
    )
    image_mean: tuple = setting("", DEFAULT_MEAN, flag=False)  # replaced by --weights' own
    image_std: tuple = setting("", DEFAULT_STD, flag=False)
    seed: int = setting("shuffles, splits, initialisation and augmentation", SEED)
    backup_every_steps: int = setting("mid-epoch backup interval for resuming", 100)
    steps_per_epoch: int | None = setting("cap each epoch (for quick runs)", default_text="the whole dataset")
    overrides: dict = dataclasses.field(  # more create_model arguments: --override KEY=VALUE
        default_factory=dict, metadata={"flag": False}
    )

    @staticmethod
    def default_text(name):
        """How a setting left unset is decided, as `keras-vit train --help` says it."""
        field = {field.name: field for field in dataclasses.fields(TrainConfig)}[name]
        if "default_text" in field.metadata:
            return field.metadata["default_text"]
        if isinstance(field.default, bool):
            return "on" if field.default else "off"
        if field.default is not None:
            return str(field.default)
        by_preset = [
            f"{preset} {values[name]}" for preset, values in sorted(PRESETS.items()) if name in values
        ]
        by_preset = "by preset: " + ", ".join(by_preset) if by_preset else ""
        fallback = DEFAULTS.get(name)
        if fallback is None:
            return by_preset or "none"
        return f"{fallback}; {by_preset}" if by_preset else str(fallback)

    def validate(self):
        """Raises ValueError for a setting no run can use; call it on a `resolved()` config."""
        self._check_choices()
        self._check_numbers()
        self._check_image_size()
        self._check_starting_points()
        self._check_lora()
        self._check_overrides()

    def _check_choices(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"Unknown strategy {self.strategy!r}; strategies: {', '.join(STRATEGIES)}.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"Unknown precision {self.precision!r}; choose {', '.join(PRECISIONS)}.")

    def _check_numbers(self):
        counts = ("epochs", "batch_size", "backup_every_steps", "repeated_augmentation", "image_size")
        for name in counts + ("steps_per_epoch", "early_stopping"):  # None: the whole dataset, off
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
        if self.lora_rank is not None and self.lora_rank < 1:
            raise ValueError(f"lora_rank must be at least 1, got {self.lora_rank}.")
        if self.freeze_blocks < 0:
            raise ValueError(f"freeze_blocks must not be negative, got {self.freeze_blocks}.")
        if self.model_parallel < 1:
            raise ValueError(f"model_parallel must be at least 1, got {self.model_parallel}.")
        if not 0 < self.crop_min_scale <= 1:
            raise ValueError(
                f"crop_min_scale is a fraction of the area in (0, 1], got {self.crop_min_scale}."
            )

    def _check_image_size(self):
        arguments = {**registry.get_model_config(self.model), **self.overrides}
        family = registry.family_named(self.model)
        step = family.image_size_step(arguments)
        if self.image_size < step:
            raise ValueError(
                f"image_size {self.image_size} is smaller than {self.model}'s patch size {step}: "
                f"choose at least {step}."
            )
        if self.image_size % step and not family.takes_partial_patches(arguments):
            raise ValueError(
                f"image_size {self.image_size} is not a multiple of {self.model}'s patch size {step}: "
                f"choose {nearest_sizes(self.image_size, step)}."
            )

    def _check_starting_points(self):
        """`--weights` and `--teacher`, before anything is built."""
        if self.weights:
            from keras_vit.training.initial_weights import check_source

            check_source(self.weights)
        if self.teacher and not os.path.exists(self.teacher):
            raise FileNotFoundError(f"Teacher not found: {self.teacher} (--teacher takes a model file).")
        if self.teacher and not {**registry.get_model_config(self.model), **self.overrides}.get(
            "distillation_token"
        ):
            can_have_one = "distillation_token" in registry.family_named(self.model).arguments()
            raise ValueError(
                f"--teacher trains a distilled student, and {self.model} has no distillation token: "
                f"use a deit_*_distilled_* model"
                + (
                    " or --override distillation_token=true."
                    if can_have_one
                    else " (any model can teach it)."
                )
            )

    def _check_lora(self):
        choices = [flag for flag, on in (("--lora-rank", self.lora_rank), ("--freeze-backbone",
                   self.freeze_backbone), ("--freeze-blocks", self.freeze_blocks)) if on]  # fmt: skip
        if len(choices) > 1:
            raise ValueError(f"{' and '.join(choices)} each choose what trains: give one.")
        if not self.lora_rank:
            return
        check_lora_targets(registry.family_named(self.model), self.lora_target_names)

    @property
    def lora_target_names(self):
        return tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())

    def _check_overrides(self):
        clash = sorted(_OWNED & set(self.overrides))
        if clash:
            raise ValueError(
                f"--override cannot set {clash}: use the matching flag (e.g. --image-size, --precision) "
                f"or let the dataset decide (classes)."
            )

    def resolved(self):
        """This config with every setting left None taken from the preset, else from
        `recipes.DEFAULTS`; validated."""
        values = dataclasses.asdict(self)
        # Pretrained weights want fine-tuning's small steps: scratch's would wash them out.
        values["preset"] = self.preset or ("finetune" if self.weights else "scratch")
        if values["preset"] not in PRESETS:
            raise ValueError(f"Unknown preset {self.preset!r}; presets: {', '.join(sorted(PRESETS))}.")
        if values["weights"] and _names_a_pretrained_model(values["weights"]):
            _take_pretrained_settings(values)
        for source in (PRESETS[values["preset"]], DEFAULTS):
            for key, value in source.items():
                if values.get(key) is None:
                    values[key] = value
        if values["image_size"] is None:
            values["image_size"] = registry.get_model_config(values["model"])["image_size"]
        if values["crop"] is None:  # (a bad image_size is refused by validate)
            values["crop"] = "pad" if values["image_size"] <= PAD_CROP_MAX_SIZE else "resized"
        config = TrainConfig(**values)
        config.validate()
        return config


# ViT arguments that come from their own settings or from the dataset; an override would disagree.
_OWNED = {"num_classes", "class_names", "image_size", "dropout", "drop_path_rate"} | {
    "image_mean", "image_std", "dtype", "name",
}  # fmt: skip


def _names_a_pretrained_model(weights):
    from keras_vit.model.pretrained import is_pretrained_name

    return is_pretrained_name(weights) and not os.path.exists(weights)


def _take_pretrained_settings(values):
    """`--weights NAME`: the pretrained model's architecture and image size, unless given, and
    its normalisation (its config.json is read; the weights download when the run builds)."""
    from keras_vit.model import pretrained, registry
    from keras_vit.model.hub_config import nearest_architecture

    name = values["weights"]
    found = registry.read_hub_model(pretrained.resolve(name))
    # A timm repo names its architecture; a transformers one is built as the nearest named one.
    architecture = nearest_architecture(found)
    if values["model"] not in (None, architecture):
        raise ValueError(
            f"--weights {name} is a {architecture}, and --model says {values['model']}: drop --model."
        )
    values["model"] = architecture
    # What the repo builds differently from the named config (a timm repo's model_args, or
    # everything a transformers repo's config says otherwise).
    named = registry.get_model_config(architecture)
    differs = {k: v for k, v in found.arguments.items() if k not in _OWNED and named.get(k) != v}
    values["overrides"] = {**differs, **values["overrides"]}
    if values["image_size"] is None:
        size = found.arguments["image_size"]
        values["image_size"] = int(size if isinstance(size, int) else size[0])
    values["image_mean"], values["image_std"] = tuple(found.image_mean), tuple(found.image_std)
    if found.license:  # a fine-tune keeps its weights' licence, and every export carries it
        values["overrides"] = {"license": found.license, **values["overrides"]}
