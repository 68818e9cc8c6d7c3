"""`keras_vit.data.contract`: a model's input contract, read from the model, met one way."""

import numpy as np
import tensorflow as tf
from conftest import TINY, encoded_in_every_format
from PIL import Image

import keras_vit
from keras_vit.data.contract import InputContract
from keras_vit.data.images import load_image, resize
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


def test_the_contract_reads_every_format_alike_in_numpy_tensorflow_and_a_training_step():
    """`read` (NumPy: predict, the apps), `decode_and_resize` (tf.data, verification; and with
    tensor ops only, the served SavedModel, which reads all but TIFF) and `resize_batch` (a
    teacher's input inside the step): the same pixels, EXIF-rotated JPEGs upright in each."""
    contract = InputContract((12, 20))
    for name, encoded in encoded_in_every_format():
        by_numpy = contract.read(encoded)
        assert by_numpy.shape == (12, 20, 3), name
        by_tensorflow = contract.decode_and_resize(tf.constant(encoded)).numpy()
        np.testing.assert_allclose(by_tensorflow, by_numpy, atol=1e-3, err_msg=name)
        if not name.endswith(".tiff"):
            in_graph = contract.decode_and_resize(tf.constant(encoded), tensor_ops_only=True).numpy()
            np.testing.assert_allclose(in_graph, by_numpy, atol=1e-3, err_msg=name)
        upright = load_image(encoded).astype("float32")[None]
        in_a_step = np.asarray(contract.resize_batch(tf.constant(upright)))[0]
        # float32 on the accelerator: a pass's tie may round to the other 8-bit step.
        steps = np.abs(in_a_step - by_numpy)
        assert steps.max() <= 1 and (steps > 0).mean() < 0.05, name
