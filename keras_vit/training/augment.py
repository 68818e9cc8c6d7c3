"""Training augmentation on whole batches, inside the compiled training step.

`BatchAugmentation` takes a batch of images (pixel values in [0, 255]) and
one-hot labels and applies, in order: a random crop (pad-and-crop or random
resized crop), a horizontal flip, RandAugment, MixUp or CutMix, and
RandomErasing. Flip, RandAugment, MixUp, CutMix and RandomErasing are Keras'
core layers (RandAugment drawing its operations per image, not per batch);
the crops are written here with `keras.ops`, because `keras.layers.RandomCrop`
cannot run under `jax.jit` (its slice bounds are traced values).

Every random draw is seeded from `(seed, step, draw)`, where `step` is a
counter the layer keeps as a weight: a run restored from a backup draws
exactly what the uninterrupted run drew, and a seed makes a run repeatable.
The layer lives in the training model only (`keras_vit.training.training_model`),
never in the saved classifier or an export.
"""

import math

import keras
from keras import ops

from keras_vit.data.datasets import SEED
from keras_vit.training.recipes import DEFAULTS

CROPS = ("pad", "resized", "none")


def _replica_id():
    """This replica's index under a `tf.distribute` strategy (0 elsewhere), so replicas draw apart."""
    if keras.backend.backend() != "tensorflow":
        return 0
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return 0 if context is None else context.replica_id_in_sync_group


class _StepSeeds(keras.random.SeedGenerator):
    """A seed generator whose draws are a function of (seed, step, draw index).

    Keras' own generators advance a state variable that a backup does not
    store; these read the step counter that it does. `start_step` numbers
    the draws of one training step from zero.
    """

    def __init__(self, seed, step_counter):
        super().__init__(seed=seed)
        self.base_seed = seed
        self.step_counter = step_counter
        self.draws = 0

    def start_step(self):
        self.draws = 0

    def next(self, ordered=True):
        self.draws += 1
        step = ops.cast(self.step_counter.value, "int32")
        replica = ops.cast(_replica_id(), "int32")
        first = ops.cast(self.base_seed % 1_000_003, "int32") + replica * 1_000_003
        second = step * 1024 + self.draws
        return ops.cast(ops.stack([first, second]), self.state.dtype)  # the backend's seed dtype


@keras.saving.register_keras_serializable(package="keras_vit")
class PerImageRandAugment(keras.layers.RandAugment):
    """Keras' `RandAugment` with its operations drawn for each image, as in the paper and timm.

    Keras draws `num_ops` operations for a whole batch, so at batch 512 every image of
    a step gets the same two. Keras computes every operation on the whole batch and
    selects among them, so drawing per image costs nothing more.
    """

    def get_random_transformation(self, data, training=True, seed=None):
        transformation = super().get_random_transformation(data, training=training, seed=seed)
        images = data["images"] if isinstance(data, dict) else data
        if transformation is None or len(images.shape) != 4:
            return transformation
        batch = self.backend.shape(images)[0]
        transformation["layer_idxes"] = self.backend.random.randint(
            (batch, self.num_ops),
            0,
            len(self._AUGMENT_LAYERS),
            seed=self._get_seed_generator(self.backend._backend),
        )
        return transformation

    def transform_images(self, images, transformation, training=True):
        if not training or len(transformation["layer_idxes"].shape) != 2:
            return super().transform_images(images, transformation, training=training)
        numpy = self.backend.numpy
        images = self.backend.cast(images, self.compute_dtype)
        for i in range(self.num_ops):
            chosen = numpy.reshape(transformation["layer_idxes"][:, i], (-1, 1, 1, 1))
            source = images  # every operation of this round sees the round's input
            for index, (name, parameters) in enumerate(transformation["transforms"].items()):
                transformed = getattr(self, name).transform_images(source, parameters)
                images = numpy.where(chosen == index, transformed, images)
        return self.backend.cast(images, self.compute_dtype)


def _interpolation_matrix(positions, size):
    """Bilinear weights `(batch, out, size)` that sample `size` pixels at `positions` (clamped)."""
    positions = ops.clip(positions, 0.0, size - 1.0)
    pixels = ops.arange(size, dtype="float32")
    return ops.relu(1.0 - ops.abs(ops.expand_dims(positions, -1) - pixels))


def _resample(images, rows, columns):
    """`out[b, i, j] = sum rows[b, i, h] * images[b, h, w] * columns[b, j, w]`: a crop and resize
    as two small matrix products, which every backend compiles."""
    return ops.einsum("bih,bhwc,bjw->bijc", rows, images, columns)


def _reflect(index, size):
    """Reflects out-of-range pixel indices back inside, as `tf.pad(mode="REFLECT")` does."""
    period = 2 * (size - 1)
    index = ops.mod(ops.abs(index), period) if size > 1 else ops.zeros_like(index)
    return ops.where(index >= size, period - index, index)


def pad_and_crop(images, seed):
    """Shifts each image by up to 1/8 of its side, filling by reflection (pad, then random crop)."""
    batch = ops.shape(images)[0]
    height, width = images.shape[1], images.shape[2]

    def one_hot_shift(size, pad):
        shift = keras.random.randint((batch, 1), -pad, pad + 1, seed=seed)
        index = _reflect(ops.arange(size, dtype="int32") + shift, size)
        return ops.one_hot(index, size, dtype="float32")

    rows = one_hot_shift(height, max(height // 8, 1))
    columns = one_hot_shift(width, max(width // 8, 1))
    return _resample(images, rows, columns)


def random_resized_crop(images, seed, min_scale=0.08, ratio=(3 / 4, 4 / 3)):
    """Inception's crop: a random box of `min_scale`..1 of the area and aspect `ratio`, resized back.

    Boxes that would leave the image are clipped to it (torchvision retries instead).
    """
    batch = ops.shape(images)[0]
    height, width = images.shape[1], images.shape[2]
    area = keras.random.uniform((batch, 1), min_scale, 1.0, seed=seed)
    log_ratio = keras.random.uniform((batch, 1), math.log(ratio[0]), math.log(ratio[1]), seed=seed)
    aspect = ops.exp(log_ratio)
    box_height = ops.minimum(ops.sqrt(area / aspect), 1.0)
    box_width = ops.minimum(ops.sqrt(area * aspect), 1.0)
    top = keras.random.uniform((batch, 1), seed=seed) * (1.0 - box_height)
    left = keras.random.uniform((batch, 1), seed=seed) * (1.0 - box_width)

    def positions(start, extent, size):
        centres = (ops.arange(size, dtype="float32") + 0.5) / size
        return (start + centres * extent) * size - 0.5

    rows = _interpolation_matrix(positions(top, box_height, height), height)
    columns = _interpolation_matrix(positions(left, box_width, width), width)
    return _resample(images, rows, columns)


@keras.saving.register_keras_serializable(package="keras_vit")
class BatchAugmentation(keras.layers.Layer):
    """The training augmentations, applied to a whole batch in the training step.

    Call it on `(images, labels)`: float images in [0, 255] of shape
    `(batch, height, width, channels)` and one-hot labels; it returns both,
    augmented when `training` is true and unchanged otherwise. Its defaults are
    `keras-vit train`'s (`keras_vit.training.recipes.DEFAULTS`): every augmentation off.

    Args:
        crop: `"pad"` (shift by up to 1/8 of the side, reflecting: small
            images), `"resized"` (random resized crop, as Inception and DeiT)
            or `"none"`.
        min_scale: float, default 0.08. Smallest crop area for `"resized"`.
        flip: bool, default True. Random horizontal flips.
        randaugment_ops: int, default 0. RandAugment operations per image; 0 is off.
        randaugment_factor: float, default 0.5. RandAugment's strength in [0, 1].
        mixup: float, default 0. MixUp's alpha; 0 is off.
        cutmix: float, default 0. CutMix's alpha; 0 is off. With both on, each
            batch gets one of the two, at random.
        erasing: float, default 0. Probability of RandomErasing per image; 0 is off.
        seed: int, default 0. Seeds every draw, with the step counter.
    """

    def __init__(
        self,
        crop="pad",
        min_scale=DEFAULTS["crop_min_scale"],
        flip=True,
        randaugment_ops=DEFAULTS["randaugment"],
        randaugment_factor=0.5,
        mixup=DEFAULTS["mixup"],
        cutmix=DEFAULTS["cutmix"],
        erasing=DEFAULTS["random_erasing"],
        seed=SEED,
        **kwargs,
    ):
        kwargs.setdefault("dtype", "float32")  # pixel arithmetic stays float32 under mixed precision
        super().__init__(**kwargs)
        if crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}, got {crop!r}.")
        if not 0.0 < min_scale <= 1.0:
            raise ValueError(f"min_scale must be in (0, 1], got {min_scale}.")
        for name, value in (("randaugment_ops", randaugment_ops), ("mixup", mixup), ("cutmix", cutmix)):
            if value < 0:
                raise ValueError(f"{name} must not be negative, got {value}.")
        if not 0.0 <= erasing <= 1.0:
            raise ValueError(f"erasing is a probability in [0, 1], got {erasing}.")
        if not 0.0 <= randaugment_factor <= 1.0:
            raise ValueError(f"randaugment_factor must be in [0, 1], got {randaugment_factor}.")
        # === Config ===
        self.crop = crop
        self.min_scale = min_scale
        self.flip = flip
        self.randaugment_ops = randaugment_ops
        self.randaugment_factor = randaugment_factor
        self.mixup = mixup
        self.cutmix = cutmix
        self.erasing = erasing
        self.seed = seed

        self.step = self.add_weight(
            shape=(), dtype="int32", initializer="zeros", trainable=False,
            aggregation="only_first_replica", name="step",
        )  # fmt: skip
        self.seeds = _StepSeeds(seed, self.step)
        self.flip_layer = keras.layers.RandomFlip("horizontal", seed=seed) if flip else None
        self.randaugment = (
            PerImageRandAugment(
                value_range=(0, 255), num_ops=randaugment_ops, factor=randaugment_factor, seed=seed
            )
            if randaugment_ops
            else None
        )
        self.mixers = []
        if mixup:
            self.mixers.append(keras.layers.MixUp(alpha=mixup, seed=seed))
        if cutmix:
            self.mixers.append(keras.layers.CutMix(factor=cutmix, seed=seed))
        self.erasing_layer = (
            keras.layers.RandomErasing(factor=erasing, value_range=(0, 255), seed=seed) if erasing else None
        )
        for layer in self._core_layers():
            _use_seeds(layer, self.seeds)

    def _core_layers(self):
        return [
            layer
            for layer in (self.flip_layer, self.randaugment, *self.mixers, self.erasing_layer)
            if layer is not None
        ]

    @property
    def active(self):
        """Whether any augmentation is switched on."""
        return self.crop != "none" or bool(self._core_layers())

    def build(self, images_shape, labels_shape=None):
        for layer in self._core_layers():
            layer.build(images_shape)

    def call(self, images, labels, training=False):
        if not training or not self.active:
            return images, labels
        self.seeds.start_step()
        images = ops.cast(images, "float32")
        labels = ops.cast(labels, "float32")
        if self.crop == "pad":
            images = pad_and_crop(images, self.seeds)
        elif self.crop == "resized":
            images = random_resized_crop(images, self.seeds, self.min_scale)
        if self.flip_layer is not None:
            images = self.flip_layer(images, training=True)
        if self.randaugment is not None:
            images = ops.clip(self.randaugment(images, training=True), 0.0, 255.0)
        images, labels = self._mix(images, labels)
        if self.erasing_layer is not None:
            images = self.erasing_layer(images, training=True)
        self.step.assign_add(1)
        return images, labels

    def _mix(self, images, labels):
        def mix(layer):
            mixed = layer({"images": images, "labels": labels}, training=True)
            return mixed["images"], mixed["labels"]

        if not self.mixers:
            return images, labels
        if len(self.mixers) == 1:
            return mix(self.mixers[0])
        coin = keras.random.uniform((), seed=self.seeds)
        mixup_images, mixup_labels = mix(self.mixers[0])
        cutmix_images, cutmix_labels = mix(self.mixers[1])
        use_mixup = coin < 0.5
        return ops.where(use_mixup, mixup_images, cutmix_images), ops.where(
            use_mixup, mixup_labels, cutmix_labels
        )

    def compute_output_spec(self, images, labels, training=False):
        return (
            keras.KerasTensor(images.shape, dtype="float32"),
            keras.KerasTensor(labels.shape, dtype="float32"),
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "crop": self.crop,
                "min_scale": self.min_scale,
                "flip": self.flip,
                "randaugment_ops": self.randaugment_ops,
                "randaugment_factor": self.randaugment_factor,
                "mixup": self.mixup,
                "cutmix": self.cutmix,
                "erasing": self.erasing,
                "seed": self.seed,
            }
        )
        return config


def _use_seeds(layer, seeds):
    """Points a Keras augmentation layer, and the layers inside it (RandAugment's), at `seeds`.

    Keras' data layers draw from `self.generator` (their documented contract).
    """
    if hasattr(layer, "generator"):
        layer.generator = seeds
    for value in vars(layer).values():
        if isinstance(value, keras.layers.Layer) and value is not layer:
            _use_seeds(value, seeds)
