"""Image-classification data on disk: the embedded cifar10-mini, folders and `.zip` files.

A dataset is a folder (or a `.zip` of one) of `class_name/image` files, or
of `train/`, `val/` (or `validation/`) and `test/` folders that each hold
them. Class names are the sorted folder names; labels are their indices.
With no validation folder, a validation split is carved from the training
images, stratified by class and deterministic for a given seed.

Images stay encoded (bytes from a `.zip`, paths in a folder) until the
tf.data pipeline decodes them, so a large folder costs no memory up front.
"""

import dataclasses
import functools
import logging
import os
import random
import zipfile

from keras_vit.data.images import IMAGE_EXTENSIONS

logger = logging.getLogger(__name__)

EMBEDDED_DATASETS = {"cifar10-mini": "cifar10_mini.zip"}
# The dataset, validation split and seed of a run that names none (keras_vit.training.recipes
# builds its defaults from them).
DATASET = "cifar10-mini"
VALIDATION_SPLIT = 0.1
SEED = 0
_SPLIT_FOLDERS = {"train": "train", "val": "validation", "validation": "validation", "test": "test"}


@dataclasses.dataclass(frozen=True)
class Split:
    """One split: encoded images (bytes) or image file paths, integer labels, and each image's
    name (its path in the folder or `.zip`), for messages."""

    images: tuple
    labels: tuple
    names: tuple = ()

    def __len__(self):
        return len(self.labels)

    def to_dataset(self):
        """A `tf.data.Dataset` of `(encoded image bytes, label)` pairs."""
        import tensorflow as tf

        if not self.labels:
            raise ValueError("This split holds no images.")
        dataset = tf.data.Dataset.from_tensor_slices((list(self.images), list(self.labels)))
        if isinstance(self.images[0], str):
            # Traced as written, as the pipeline's functions are (pipeline._as_written says why).
            read = tf.autograph.experimental.do_not_convert(
                lambda path, label: (tf.io.read_file(path), label)
            )
            dataset = dataset.map(read, num_parallel_calls=tf.data.AUTOTUNE)
        return dataset


@dataclasses.dataclass(frozen=True)
class ImageFolder:
    """A dataset read from a folder or `.zip`: class names and named splits."""

    source: str
    class_names: tuple
    splits: dict

    def __getitem__(self, split):
        if split not in self.splits:
            raise KeyError(f"{self.source} has no {split!r} split; it has {sorted(self.splits)}.")
        return self.splits[split]


@dataclasses.dataclass(frozen=True)
class TfdsSplit:
    """One split of a tensorflow-datasets dataset, with the same interface as `Split`."""

    builder: object
    split: str

    def __len__(self):
        try:  # from the metadata, also for slices such as "train[:90%]"
            return self.builder.info.splits[self.split].num_examples
        except KeyError:  # an unprepared builder: count
            return len(self.labels)

    def to_dataset(self):
        """A `tf.data.Dataset` of `(uint8 image, label)` pairs."""
        return self.builder.as_dataset(split=self.split, as_supervised=True, shuffle_files=False)

    @functools.cached_property
    def labels(self):
        return tuple(int(y) for y in self.to_dataset().map(lambda x, y: y).as_numpy_iterator())


def load_dataset(name, validation_split=VALIDATION_SPLIT, seed=SEED, data_dir=None):
    """A dataset by name: an embedded one, a folder or `.zip`, or a tensorflow-datasets name.

    tfds datasets download and prepare on first use (into `data_dir`, by
    default tfds' own folder); with no validation split, the last
    `validation_split` of the training split is held out.
    """
    if name in EMBEDDED_DATASETS or os.path.exists(os.fspath(name)):
        return read_image_folder(name, validation_split=validation_split, seed=seed)
    if os.sep in os.fspath(name) or os.fspath(name).endswith(".zip"):
        raise FileNotFoundError(f"Dataset not found: {name}")
    return read_tfds(name, validation_split=validation_split, data_dir=data_dir)


def read_tfds(name, validation_split=VALIDATION_SPLIT, data_dir=None):
    """Reads an image-classification dataset from tensorflow-datasets."""
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as error:  # tfds raises its own DatasetNotFoundError
        raise ValueError(
            f"{name!r} is neither a folder, a .zip, an embedded dataset ({', '.join(EMBEDDED_DATASETS)}) "
            f"nor a tensorflow-datasets name: {str(error).splitlines()[0]}"
        ) from None
    info = builder.info
    keys = info.supervised_keys
    if not keys or "label" not in info.features or not hasattr(info.features["label"], "names"):
        raise ValueError(f"tfds dataset {name!r} is not an image-classification dataset with named labels.")
    builder.download_and_prepare()
    # An unprepared builder (as under tfds.testing.mock_data) lists no splits: assume the usual pair.
    available = list(info.splits.keys()) or ["train", "test"]
    if "train" not in available:
        raise ValueError(f"tfds dataset {name!r} has no train split; it has {available}.")
    chosen = {"train": "train"}
    chosen.update({c: c for c in ("validation", "test") if c in available})
    if "validation" not in chosen:
        percent = max(1, round(100 * validation_split))
        chosen["train"], chosen["validation"] = f"train[:{100 - percent}%]", f"train[{100 - percent}%:]"
    result = {role: TfdsSplit(builder, split) for role, split in chosen.items()}
    return ImageFolder(source=f"tfds:{name}", class_names=tuple(info.features["label"].names), splits=result)


def embedded_dataset_path(name):
    """The path of an embedded dataset's archive, e.g. `embedded_dataset_path("cifar10-mini")`."""
    if name not in EMBEDDED_DATASETS:
        raise ValueError(f"Unknown embedded dataset {name!r}; embedded: {sorted(EMBEDDED_DATASETS)}.")
    return os.path.join(os.path.dirname(__file__), "embedded", EMBEDDED_DATASETS[name])


def read_image_folder(path, validation_split=VALIDATION_SPLIT, seed=SEED):
    """Reads a folder or `.zip` of `class_name/image` files, or an embedded dataset name.

    Args:
        path: a folder, a `.zip` file, or the name of an embedded dataset
            (`"cifar10-mini"`).
        validation_split: fraction of each class's training images held out
            for validation when the dataset has no validation folder.
        seed: int. Chooses which images are held out; the same seed gives
            the same split.

    Returns:
        An `ImageFolder` with `class_names` and splits `"train"`,
        `"validation"` and, when the dataset has one, `"test"`.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: the layout is not `class_name/image`, a class has no
            images, there are fewer than 2 classes, or splits disagree on
            the classes.
    """
    if isinstance(path, str) and path in EMBEDDED_DATASETS:
        path = embedded_dataset_path(path)
    path = os.fspath(path)
    if not 0.0 <= validation_split < 1.0:
        raise ValueError(f"validation_split must be in [0, 1), got {validation_split}.")
    if not os.path.exists(path):
        raise FileNotFoundError(f"Dataset not found: {path}")
    if os.path.isdir(path):
        files, read = _list_folder(path), None
    elif zipfile.is_zipfile(path):
        files, read = _list_zip(path)
    else:
        raise ValueError(f"{path} is neither a folder nor a .zip of class_name/image files.")

    prefix = _common_folder(files)
    by_split = _group([f[len(prefix) :] for f in files if f != prefix], path)
    class_names = _class_names(by_split, path)
    index = {name: i for i, name in enumerate(class_names)}

    def make_split(per_class):
        pairs = [(f, index[c]) for c in class_names for f in per_class.get(c, [])]
        names = [prefix + f for f, _ in pairs]
        images = tuple(read(n) if read else os.path.join(path, *n.split("/")) for n in names)
        return Split(images, tuple(label for _, label in pairs), tuple(names))

    train = by_split.get("train", {})
    if "validation" not in by_split:
        train, by_split["validation"] = _hold_out(train, validation_split, seed)
    splits = {"train": make_split(train), "validation": make_split(by_split["validation"])}
    if "test" in by_split:
        splits["test"] = make_split(by_split["test"])
    return ImageFolder(source=path, class_names=tuple(class_names), splits=splits)


def _list_folder(root):
    """Relative paths with "/" separators; folders end with "/", as in a zip listing."""
    entries = []
    for folder, subfolders, names in os.walk(root):
        prefix = "" if folder == root else "/".join(os.path.relpath(folder, root).split(os.sep)) + "/"
        entries += [prefix + name + "/" for name in subfolders]
        entries += [prefix + name for name in names]
    return sorted(entries)


def _list_zip(path):
    archive = zipfile.ZipFile(path)
    return sorted(archive.namelist()), archive.read


def _common_folder(files):
    """One folder that wraps everything, as `cifar10_mini/` in `cifar10_mini/train/...`, or ""."""
    tops = {f.split("/", 1)[0] for f in files}
    images = [f for f in files if not f.endswith("/")]
    # Only a wrapper if images still sit in class folders below it: "cat/x.png" is one class.
    if len(tops) == 1 and images and all(f.count("/") >= 2 for f in images):
        top = tops.pop()
        if top.lower() not in _SPLIT_FOLDERS:
            return top + "/"
    return ""


def _group(files, source):
    """{split: {class: [files]}} from `split/class/image` or `class/image` paths."""
    folders = [f[:-1] for f in files if f.endswith("/")]
    files = [f for f in files if not f.endswith("/")]
    images = [f for f in files if f.lower().endswith(IMAGE_EXTENSIONS)]
    skipped = len(files) - len(images)
    if skipped:
        logger.warning(
            "%s: skipped %d file(s) that are not %s images.", source, skipped, "/".join(IMAGE_EXTENSIONS)
        )
    split_layout = any(f.split("/", 1)[0].lower() in _SPLIT_FOLDERS and f.count("/") >= 2 for f in images)
    grouped = {}
    for f in images:
        parts = f.split("/")
        if split_layout:
            if len(parts) != 3 or parts[0].lower() not in _SPLIT_FOLDERS:
                raise ValueError(
                    f"{source}: {f!r} is not at split/class_name/image; a dataset with train/ "
                    f"and val/ or test/ folders keeps every image two folders down."
                )
            split, class_name = _SPLIT_FOLDERS[parts[0].lower()], parts[1]
        else:
            if len(parts) != 2:
                raise ValueError(
                    f"{source}: {f!r} is not at class_name/image; put each image in a folder named "
                    f"after its class."
                )
            split, class_name = "train", parts[0]
        grouped.setdefault(split, {}).setdefault(class_name, []).append(f)
    if not grouped:
        raise ValueError(
            f"{source} holds no class_name/image files (looked for {', '.join(IMAGE_EXTENSIONS)})."
        )
    class_depth = 2 if split_layout else 1
    holding = {f.rsplit("/", 1)[0] for f in images}
    empty = sorted(f for f in folders if f.count("/") == class_depth - 1 and f not in holding)
    if split_layout:
        empty = [f for f in empty if f.split("/", 1)[0].lower() in _SPLIT_FOLDERS]
    if empty:
        raise ValueError(f"{source}: class folder(s) with no images: {empty}. Add images or remove them.")
    return grouped


def _class_names(by_split, source):
    # A dataset of held-out images alone (val/ or test/, no train/) is one to evaluate on.
    names = sorted(by_split.get("train") or set().union(*by_split.values()))
    if len(names) < 2:
        raise ValueError(
            f"{source} has {len(names)} class folder(s) ({names}); a classifier needs at least 2."
        )
    for split, classes in by_split.items():
        extra = sorted(set(classes) - set(names))
        if extra:
            raise ValueError(f"{source}: the {split} split has classes the train split lacks: {extra}.")
    return names


def _hold_out(per_class, fraction, seed):
    """Splits each class's files into (train, validation), deterministically for a seed."""
    train, validation = {}, {}
    for class_name, files in per_class.items():
        order = sorted(files)
        random.Random(f"{seed}/{class_name}").shuffle(order)
        count = round(len(order) * fraction)
        if fraction > 0 and len(order) > 1:
            count = min(max(count, 1), len(order) - 1)  # every class on both sides
        validation[class_name] = sorted(order[:count])
        train[class_name] = sorted(order[count:])
    return train, validation
