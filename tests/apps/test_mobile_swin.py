"""The phone page (LiteRT.js in Chromium) runs a Swin's `.tflite`: the shift's slices and
concatenations, the 5-D window transposes and the masks in the browser give Python LiteRT's
probabilities, and the desktop app's inference names the same top class."""

import os

import keras
import numpy as np
import pytest
from conftest import phone_app

pytest.importorskip("playwright")

import keras_vit  # noqa: E402
from keras_vit.apps.desktop.inference import LoadedModel  # noqa: E402
from keras_vit.apps.mobile import browser  # noqa: E402
from keras_vit.data import datasets as data  # noqa: E402
from keras_vit.data.contract import InputContract  # noqa: E402
from keras_vit.export.exporter import export_model  # noqa: E402
from keras_vit.inference.runtimes import TFLiteRunner  # noqa: E402

# A 16x16 grid in windows of 4: shifted, masked blocks; a stage whose grid is its window.
TINY_SWIN = dict(image_size=64, embed_dim=16, depths=(2, 2, 1, 1), num_heads=(1, 2, 2, 4), window_size=4)


@pytest.fixture(scope="module")
def swin_tflite(tmp_path_factory):
    class_names = list(data.load_dataset("cifar10-mini").class_names)
    keras.utils.set_random_seed(1)
    model = keras_vit.Swin(
        **TINY_SWIN, num_classes=10, class_names=class_names, image_mean=[0.5] * 3, image_std=[0.25] * 3
    )
    path = tmp_path_factory.mktemp("swin") / "swin.keras"
    model.save(path)
    manifest = export_model(
        str(path), output=str(tmp_path_factory.mktemp("exports")), formats=("tflite",), quantize=(),
        dataset="cifar10-mini", verify=False,
    )  # fmt: skip
    return os.path.join(manifest["folder"], "model.tflite")


def test_the_phone_page_gives_litert_s_probabilities_for_a_swin(swin_tflite, phone, image_folder, tmp_path):
    runner = TFLiteRunner(swin_tflite)
    with phone_app(phone, swin_tflite, tmp_path / "app") as page:
        for path in sorted(image_folder.glob("*.png"))[:6]:
            result = browser.classify(page, path)
            assert result["error"] is None, path.name
            probabilities = runner.predict([InputContract.of(runner).read(path)])[0]
            in_page = np.asarray(page.evaluate("Array.from(window.kerasVit.lastProbabilities)"))
            assert np.abs(in_page - probabilities).max() < 1e-5, path.name
            top = result["predictions"][0]["name"]
            assert probabilities[runner.class_names.index(top)] == pytest.approx(
                probabilities.max(), abs=1e-6
            )


def test_the_desktop_app_classifies_with_a_swin(swin_tflite, image_folder):
    model = LoadedModel.open(swin_tflite)
    assert not model.has_attention  # a Swin has no global attention map
    runner = TFLiteRunner(swin_tflite)
    for path in sorted(image_folder.glob("*.png"))[:3]:
        prediction = model.classify_file(str(path))
        probabilities = runner.predict([InputContract.of(runner).read(path)])[0]
        assert prediction.top_k[0][1] == pytest.approx(float(probabilities.max()), abs=1e-6), path.name
        assert prediction.attention is None
