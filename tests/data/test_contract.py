"""`keras_vit.data.contract`: a model's input contract, read from the model, met one way."""

import numpy as np
from conftest import TINY
from PIL import Image

import keras_vit
from keras_vit.data.contract import InputContract
from keras_vit.data.images import resize
from keras_vit.inference.classifier import load_classifier


def test_the_contract_is_read_from_the_model_and_carried_by_its_exports():
    model = keras_vit.ViT(**TINY, image_mean=[0.5] * 3, image_std=[0.25] * 3, class_names=list("abcdefghij"))
    contract = InputContract.of(model)
    assert contract == InputContract((32, 32), 3, list("abcdefghij"), [0.5] * 3, [0.25] * 3)
    assert InputContract.of(load_classifier(model)).image_size == contract.image_size


def test_a_run_recorded_before_the_contract_still_resumes():
    """`preprocessing.json` of runs written before: each key it held keeps its value."""
    recorded_before = {
        "image_size": [32, 32],
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "input_range": [0, 255],
        "resize": "bilinear, antialiased, to image_size",
    }
    description = InputContract((32, 32), image_mean=[0.5] * 3, image_std=[0.5] * 3).description()
    assert {key: description[key] for key in recorded_before} == recorded_before


def test_reading_a_file_is_decoding_upright_then_the_one_resize(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 8  # shown rotated 90 degrees counter-clockwise
    Image.fromarray(pixels).save(tmp_path / "photo.png", exif=exif.tobytes())
    read = InputContract((10, 5)).read(tmp_path / "photo.png")
    upright = np.rot90(pixels)  # 30 x 20
    np.testing.assert_allclose(read, resize(upright, (10, 5)), atol=1e-4)
    assert read.shape == (10, 5, 3) and read.dtype == np.float32
