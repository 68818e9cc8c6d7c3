"""The training input pipeline's images/s, to set against the training step's.

The pipeline must never be what limits training: it should produce at least 3x the
images/s the training step consumes, because on a CPU both share the same cores.

The pipeline reads, decodes, resizes and batches; augmentation runs in the training step
(`keras_vit.training.augment`), so it is not part of these figures.

- CIFAR-10: the embedded cifar10-mini's training PNGs at 32 x 32 (decoded once, cached).
- 224 x 224: the Imagenette validation JPEGs from `../shared/datasets/` when they are there
  (else photo-sized synthetic JPEGs), resized to 224.
"""

import io
import os
import time
import zipfile

import numpy as np
import tensorflow as tf

from keras_vit.data.datasets import read_image_folder
from keras_vit.data.pipeline import training_batches

IMAGENETTE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    os.pardir,
    os.pardir,
    "shared",
    "datasets",
    "imagenette2_224_val.zip",
)


def images_per_second(pairs, image_size, batch_size, seconds):
    """Training batches as `model.fit` would pull them, after one warm-up pass over the data."""
    dataset = training_batches(pairs, image_size=image_size, batch_size=batch_size, seed=0)
    batches = iter(dataset)
    for _ in range(max(1, int(pairs.cardinality()) // batch_size)):  # fills the cache of encoded images
        next(batches)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        count += int(next(batches)["images"].shape[0])
    return count / (time.perf_counter() - start)


def cifar10(batch_size=128, seconds=10):
    train = read_image_folder("cifar10-mini")["train"]
    return images_per_second(train.to_dataset(), (32, 32), batch_size, seconds)


def _imagenette_pairs(limit=1000):
    if not os.path.exists(IMAGENETTE):
        return None, "synthetic"
    images, labels, classes = [], [], {}
    with zipfile.ZipFile(IMAGENETTE) as archive:
        names = sorted(n for n in archive.namelist() if n.lower().endswith((".jpeg", ".jpg", ".png")))
        for name in names[:: max(1, len(names) // limit)][:limit]:
            images.append(archive.read(name))
            labels.append(classes.setdefault(name.split("/")[-2], len(classes)))
    return tf.data.Dataset.from_tensor_slices((images, labels)), "imagenette2_224_val"


def _synthetic_jpegs(count=200, shape=(375, 500)):
    """Smooth random photos (gradients and noise) as 500 x 375 JPEGs, Imagenette's typical size."""
    from PIL import Image

    rng = np.random.default_rng(0)
    rows, cols = np.mgrid[0 : shape[0], 0 : shape[1]]
    encoded = []
    for _ in range(count):
        base = rng.uniform(0, 255, 3) + rows[..., None] * rng.uniform(-0.3, 0.3, 3) + cols[..., None] * 0.2
        pixels = np.clip(base + rng.normal(0, 12, shape + (3,)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        encoded.append(buffer.getvalue())
    labels = [i % 10 for i in range(count)]
    return tf.data.Dataset.from_tensor_slices((encoded, labels))


def images_224(batch_size=32, seconds=10):
    """Returns (images/s, the source of the JPEGs)."""
    pairs, source = _imagenette_pairs()
    if pairs is None:
        pairs = _synthetic_jpegs()
    rate = images_per_second(pairs, (224, 224), batch_size, seconds)
    return rate, source
