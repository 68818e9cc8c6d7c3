"""The training recipes and the choices `keras-vit train` offers.

Plain data, apart from the training code that applies it. A run's setting
comes from the user's flag, else from its preset, else from `DEFAULTS`.
"""

# The validation split when the user names none: the data's own default.
from keras_vit.data.datasets import VALIDATION_SPLIT

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# Where a run trains (keras_vit/training/distribute.py makes each one).
STRATEGIES = ("auto", "mirrored", "model-parallel", "multi-worker", "one-device")

# Images this small (a side in pixels, CIFAR's 32) are padded and cropped back by default; larger
# ones get Inception's random resized crop.
PAD_CROP_MAX_SIZE = 64

# Where neither the user nor the preset chooses.
DEFAULTS = dict(
    model="vit_nano_patch4_32",
    epochs=15,
    batch_size=128,
    label_smoothing=0.1,
    validation_split=VALIDATION_SPLIT,
    crop_min_scale=0.08,
    randaugment=0,
    mixup=0.0,
    cutmix=0.0,
    random_erasing=0.0,
    repeated_augmentation=1,
    ema=0.0,
    layer_decay=1.0,
    distillation_weight=0.5,  # DeiT's hard distillation
    precision="float32",
)

PRESETS = {
    # From scratch on small images (DeiT-style, scaled down): strong decay, long warmup.
    "scratch": dict(learning_rate=1e-3, weight_decay=0.05, warmup_epochs=2, drop_path_rate=0.1),
    # Fine-tune a pretrained model: small steps, short warmup, Inception crops that keep
    # most of the object.
    "finetune": dict(
        learning_rate=1e-4,
        weight_decay=0.01,
        warmup_epochs=1,
        drop_path_rate=0.1,
        crop="resized",
        crop_min_scale=0.35,
    ),
    # A plain ViT from scratch on CIFAR-10 (50,000 images of 32x32): the published
    # small-data recipe (Lee et al. 2021, DeiT) on one GPU: RandAugment, MixUp or CutMix
    # per batch, RandomErasing, label smoothing and stochastic depth; bfloat16 for speed.
    # docs/benchmarks/cifar10.md has its measured results and command.
    "small-scratch": dict(
        model="vit_cifar_patch4_32",
        epochs=200,
        batch_size=512,
        learning_rate=2e-3,
        weight_decay=0.05,
        warmup_epochs=10,
        drop_path_rate=0.1,
        label_smoothing=0.1,
        validation_split=0.02,
        crop="pad",
        randaugment=2,
        mixup=0.8,
        cutmix=1.0,
        random_erasing=0.25,
        precision="mixed_bfloat16",
    ),
}
