import collections
import hashlib
import os
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from keras_vit.data import datasets as data

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
REPOSITORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
SHARED_CIFAR10 = os.path.join(REPOSITORY, "..", "shared", "datasets", "cifar10_png.zip")


def test_cifar10_mini_is_a_stratified_subset_of_real_cifar10():
    dataset = data.read_image_folder("cifar10-mini")
    assert dataset.class_names == CIFAR10_CLASSES
    assert os.path.getsize(data.embedded_dataset_path("cifar10-mini")) <= 10 * 2**20
    expected = {"train": 270, "validation": 30, "test": 50}  # per class; validation carved from train
    for split, per_class in expected.items():
        counts = collections.Counter(dataset[split].labels)
        assert counts == {label: per_class for label in range(10)}, split
    held_out = set(dataset["validation"].images)
    assert not held_out & set(dataset["train"].images)
    for encoded in dataset["test"].images[::50]:
        image = tf.io.decode_png(encoded).numpy()
        assert image.shape == (32, 32, 3) and image.dtype == np.uint8


@pytest.mark.skipif(
    not os.path.exists(SHARED_CIFAR10), reason="shared/datasets/cifar10_png.zip is not beside the checkout"
)
def test_cifar10_mini_rebuilds_byte_for_byte_from_the_shared_archive(tmp_path):
    import runpy

    script = os.path.join(REPOSITORY, "scripts", "make_cifar10_mini.py")
    build = runpy.run_path(script)["build"]
    build(SHARED_CIFAR10, str(tmp_path / "mini.zip"), train_per_class=300, test_per_class=50, seed=0)
    digest = lambda p: hashlib.md5(open(p, "rb").read()).hexdigest()  # noqa: E731
    assert digest(tmp_path / "mini.zip") == digest(data.embedded_dataset_path("cifar10-mini"))


def _png(value, channels=3):
    return tf.io.encode_png(np.full((6, 5, channels), value, np.uint8)).numpy()


def _write_folder(root, layout):
    """layout: {relative folder: number of images}; each image's pixels encode its folder."""
    for i, (folder, count) in enumerate(sorted(layout.items())):
        os.makedirs(root / folder, exist_ok=True)
        for j in range(count):
            (root / folder / f"img_{j:03d}.png").write_bytes(_png(i * 10 + j % 10))
    return root


def test_a_flat_folder_gets_a_deterministic_stratified_validation_split(tmp_path):
    root = _write_folder(tmp_path / "flowers", {"daisy": 20, "rose": 10, "tulip": 5})
    (root / "notes.txt").write_text("not an image")
    dataset = data.read_image_folder(root, validation_split=0.2, seed=3)
    assert dataset.class_names == ("daisy", "rose", "tulip")
    assert collections.Counter(dataset["validation"].labels) == {0: 4, 1: 2, 2: 1}
    assert collections.Counter(dataset["train"].labels) == {0: 16, 1: 8, 2: 4}
    assert "test" not in dataset.splits
    again = data.read_image_folder(root, validation_split=0.2, seed=3)
    assert again["validation"].images == dataset["validation"].images
    other = data.read_image_folder(root, validation_split=0.2, seed=4)
    assert other["validation"].images != dataset["validation"].images


def test_a_zip_reads_like_the_folder_it_was_made_from(tmp_path):
    root = _write_folder(
        tmp_path / "pets", {"train/cat": 6, "train/dog": 6, "val/cat": 2, "val/dog": 3, "test/dog": 1}
    )
    archive = tmp_path / "pets.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for folder, _, names in os.walk(root):
            for name in names:
                full = os.path.join(folder, name)
                z.write(full, os.path.relpath(full, tmp_path))  # wrapped in pets/
    from_folder = data.read_image_folder(root)
    from_zip = data.read_image_folder(archive)
    assert from_zip.class_names == from_folder.class_names == ("cat", "dog")
    for split in ("train", "validation", "test"):
        assert from_zip[split].labels == from_folder[split].labels
        read = [open(p, "rb").read() for p in from_folder[split].images]
        assert list(from_zip[split].images) == read
    assert len(from_zip["validation"]) == 5  # the val/ folder, nothing carved from train


def test_splits_become_tf_data_of_encoded_images_and_labels(tmp_path):
    root = _write_folder(tmp_path / "shapes", {"a": 3, "b": 3})
    split = data.read_image_folder(root, validation_split=0.0)["train"]
    pairs = list(split.to_dataset().as_numpy_iterator())
    assert [label for _, label in pairs] == [0, 0, 0, 1, 1, 1]
    first = tf.io.decode_png(pairs[3][0]).numpy()
    assert first.shape == (6, 5, 3) and first[0, 0, 0] == 10  # class b's first image


@pytest.mark.parametrize(
    "layout,message",
    [
        ({"cat": 3}, r"1 class folder\(s\) \(\['cat'\]\); a classifier needs at least 2"),
        ({"cat": 3, "dog": 0}, r"class folder\(s\) with no images: \['dog'\]"),
        (
            {"train/cat": 2, "train/dog": 2, "test/bird": 1},
            r"test split has classes the train split lacks: \['bird'\]",
        ),
        ({}, "holds no class_name/image files"),
    ],
)
def test_bad_layouts_name_the_problem(tmp_path, layout, message):
    root = _write_folder(tmp_path / "bad", layout)
    os.makedirs(root, exist_ok=True)
    with pytest.raises(ValueError, match=message):
        data.read_image_folder(root)


def test_held_out_images_alone_are_a_dataset_to_evaluate_on_and_training_on_it_is_one_line(tmp_path):
    from keras_vit.data import pipeline

    root = _write_folder(tmp_path / "imagenette", {"val/n01440764": 2, "val/n02102040": 3})
    dataset = data.read_image_folder(root)
    assert dataset.class_names == ("n01440764", "n02102040")
    assert len(dataset["train"]) == 0 and dataset["validation"].labels == (0, 0, 1, 1, 1)
    with pytest.raises(
        ValueError, match=r"imagenette has no training images: .* is for `keras-vit evaluate`"
    ):
        pipeline.read_training_data(root, image_size=(8, 8), batch_size=2)


def test_missing_paths_and_non_datasets_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="Dataset not found: .*nowhere"):
        data.read_image_folder(tmp_path / "nowhere")
    (tmp_path / "image.png").write_bytes(_png(1))
    with pytest.raises(ValueError, match="neither a folder nor a .zip"):
        data.read_image_folder(tmp_path / "image.png")
    with pytest.raises(ValueError, match=r"validation_split must be in \[0, 1\)"):
        data.read_image_folder("cifar10-mini", validation_split=1.5)
    with pytest.raises(ValueError, match="Unknown embedded dataset 'cifar100-mini'"):
        data.embedded_dataset_path("cifar100-mini")


def test_a_folder_of_every_image_type_the_apps_open_decodes_as_predict_does_and_trains(tmp_path):
    from PIL import Image

    from keras_vit.data import images, pipeline
    from keras_vit.training.config import TrainConfig
    from keras_vit.training.train import train

    rng = np.random.default_rng(0)
    for name, colour in {"red": (230, 20, 20), "blue": (20, 20, 230)}.items():
        (tmp_path / "data" / name).mkdir(parents=True)
        for extension in images.IMAGE_EXTENSIONS:  # Pillow picks each format from the extension
            noise = rng.integers(-15, 15, (32, 32, 3))
            pixels = np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / name / f"image{extension}")

    dataset = data.read_image_folder(tmp_path / "data", validation_split=0)
    files = dataset["train"].images
    assert sorted(os.path.splitext(f)[1] for f in files) == sorted(images.IMAGE_EXTENSIONS * 2)
    for path in files:
        decoded = pipeline.decode_image(tf.io.read_file(path)).numpy().astype(int)
        expected = images.load_image(path).astype(int)  # what `keras-vit predict` and the apps see
        # JPEG: TensorFlow's and Pillow's IDCTs differ by a level or two; the rest are lossless.
        tolerance = 4 if path.endswith((".jpg", ".jpeg")) else 0
        assert np.abs(decoded - expected).max() <= tolerance, path

    run = train(
        TrainConfig(
            dataset=str(tmp_path / "data"),
            output=str(tmp_path / "run"),
            epochs=1,
            batch_size=4,
            validation_split=0,
            overrides=dict(hidden_dim=32, depth=2, num_heads=4, mlp_dim=64),
            jit_compile=False,  # the decode is under test, not XLA (its CPU compile costs seconds)
        )
    )
    assert run.summary["steps"] == 2 * len(images.IMAGE_EXTENSIONS) // 4


def test_a_run_that_held_out_nothing_is_verified_on_another_datasets_val_folder(colors_dataset, tmp_path):
    """What the refusal advises works: a folder whose val/ holds images of the same classes."""
    import shutil

    from keras_vit.storage.run_folder import DatasetSpec

    spec = DatasetSpec(name=colors_dataset, validation_split=0.0)
    with pytest.raises(ValueError, match="no held-out images here .* whose val/ or test/ folder holds"):
        spec.held_out()
    shutil.copytree(colors_dataset, tmp_path / "other" / "val")
    dataset, split = spec.with_name(tmp_path / "other").held_out()
    assert split == "validation" and len(dataset[split]) == 72
