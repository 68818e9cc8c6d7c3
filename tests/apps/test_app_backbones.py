"""The apps classify with fine-tuned DINOv2, SigLIP and DINOv3 exports.

Each kind starts as a user's fine-tune does: a pretrained timm repo, here a tiny random one (timm
builds it from a real tag's entry point and `save_for_hf` writes it; the stand-in hub serves it
as `hf-hub:timm/<tag>`, timm_reference.py), fine-tuned by `keras-vit train --weights` on
cifar10-mini with a new 10-class head for a few steps and exported to TFLite. The weights are
random, so this proves the wiring, not accuracy: the phone page (LiteRT.js in Chromium) gives
Python LiteRT's probabilities, the desktop app's inference names the same top class, MediaPipe's
ImageClassifier reads the metadata with the new head's class names, and the weights' licence
(DINOv3's own) reaches the metadata."""

import os

import keras
import numpy as np
import pytest
import timm
import torch
from conftest import phone_app
from PIL import Image
from timm_reference import hub_cache_at, reference_kind

pytest.importorskip("playwright")

from keras_vit.apps.desktop.inference import LoadedModel  # noqa: E402
from keras_vit.apps.mobile import browser  # noqa: E402
from keras_vit.cli import main  # noqa: E402
from keras_vit.data import datasets as data  # noqa: E402
from keras_vit.data.contract import InputContract  # noqa: E402
from keras_vit.export.exporter import export_model  # noqa: E402
from keras_vit.inference.runtimes import TFLiteRunner  # noqa: E402
from keras_vit.inference.tflite_metadata import read_metadata  # noqa: E402

# Tiny, at cifar10-mini's 32 px: 2 blocks (timm_reference.SMALL) of width 32 and 2 heads, 8x8
# patches of 4. (kind, timm tag, model_args beyond SMALL.)
TINY = dict(embed_dim=32, img_size=32, patch_size=4)
KINDS = [
    # DINOv2 with registers: 4 register tokens, LayerScale, [cls] pooling.
    ("dinov2", "vit_small_patch14_reg4_dinov2.lvd142m", TINY),
    # SigLIP: no [cls], the MAP head's attention pooling (global_pool='map').
    ("siglip", "vit_base_patch16_siglip_224.webli", TINY),
    # DINOv3 (timm's eva module): its rotary embedding, 4 registers, LayerScale; its own licence.
    ("dinov3", "vit_small_patch16_dinov3.lvd1689m", TINY),
]


def _randomize(reference):
    """Random LayerScale, norms and MAP latent, so that the blocks and the pooling show in the
    outputs (LayerScale starts at 1e-5)."""
    for key, parameter in reference.named_parameters():
        if key.endswith(("gamma", "gamma_1", "gamma_2", "latent")) or "norm" in key:
            parameter.copy_(torch.randn_like(parameter) * 0.5 + (1 if "weight" in key else 0))


@pytest.fixture(scope="module", params=KINDS, ids=[kind for kind, *_ in KINDS])
def fine_tuned(request, tmp_path_factory):
    """The kind's pretrained repo served, fine-tuned by `keras-vit train --weights` for two steps
    and exported: `(timm_reference.ReferenceKind, path of the fp32 .tflite)`."""
    name, tag, extra = request.param
    kind = reference_kind((name, tag, extra, None), _randomize, tmp_path_factory.mktemp("hub-cache"))
    run = tmp_path_factory.mktemp(f"{name}-run") / "run"
    keras.utils.set_random_seed(0)
    # Two steps at a high learning rate, no warmup: the new head moves off the uniform guess, so
    # each image's top class leads the next by more than LiteRT.js' rounding.
    # At 32 px: DINOv3's tag keeps timm's 256 px input_size whatever img_size its model was built
    # at (its rotary positions take any size), so the run asks for the size, as a user would.
    arguments = [
        "train", "--weights", kind.hub_name, "--dataset", "cifar10-mini", "--output", str(run),
        "--image-size", "32", "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "8",
        "--learning-rate", "1e-2", "--warmup-epochs", "0", "--seed", "0", "--no-jit-compile",
    ]  # fmt: skip
    with hub_cache_at(tmp_path_factory.mktemp("train-hub-cache")):
        assert main(arguments) == 0
    manifest = export_model(
        str(run), output=str(tmp_path_factory.mktemp(f"{name}-exports")), formats=("tflite",), quantize=(),
        verify=False,
    )  # fmt: skip
    return kind, os.path.join(manifest["folder"], "model.tflite")


def _images(image_folder, count):
    return sorted(image_folder.glob("*.png"))[:count]


def test_the_export_is_the_fine_tuned_kind_with_its_class_names_and_licence(fine_tuned):
    kind, path = fine_tuned
    with open(path, "rb") as f:
        metadata = read_metadata(f.read())
    assert metadata["name"] == kind.tag.split(".")[0]  # the architecture the run took from the repo
    assert metadata["labels"] == list(data.load_dataset("cifar10-mini").class_names)  # the new head's
    # The weights' licence, as the tag's pretrained_cfg gives it (DINOv3's: dinov3-license).
    assert metadata["license"] and metadata["license"] == timm.models.get_pretrained_cfg(kind.tag).license
    model = kind.model  # the pretrained backbone the run started from
    if kind.name == "dinov2":
        assert model.register_tokens == 4 and model.layer_scale
    elif kind.name == "siglip":
        assert model.pooling == "map" and not model.class_token
    else:
        assert model.family == "eva" and model.rope_type == "dinov3"


def test_the_phone_page_gives_litert_s_probabilities(fine_tuned, phone, image_folder, tmp_path):
    _, path = fine_tuned
    runner = TFLiteRunner(path)
    shown = []
    with phone_app(phone, path, tmp_path / "app") as page:
        for image in _images(image_folder, 4):
            result = browser.classify(page, image)
            assert result["error"] is None, image.name
            probabilities = runner.predict([InputContract.of(runner).read(image)])[0]
            in_page = np.asarray(page.evaluate("Array.from(window.kerasVit.lastProbabilities)"))
            assert np.abs(in_page - probabilities).max() < 1e-5, image.name
            shown.append(in_page)
            assert result["predictions"][0]["name"] == runner.class_names[int(np.argmax(probabilities))]
    # The backbone's features reach the head in the page: each image gets its own probabilities.
    assert np.abs(np.asarray(shown) - shown[0]).max() > 1e-3


def test_the_desktop_app_names_litert_s_top_class(fine_tuned, image_folder):
    _, path = fine_tuned
    model = LoadedModel.open(path)
    runner = TFLiteRunner(path)
    for image in _images(image_folder, 4):
        prediction = model.classify_file(str(image))
        probabilities = runner.predict([InputContract.of(runner).read(image)])[0]
        name, probability = prediction.top_k[0]
        assert name == runner.class_names[int(np.argmax(probabilities))], image.name
        assert probability == pytest.approx(float(probabilities.max()), abs=1e-6), image.name


def test_mediapipe_s_image_classifier_reads_the_metadata(fine_tuned, image_folder):
    """MediaPipe's ImageClassifier names LiteRT's top class from the packed labels, with its
    probability (the 32 px images are at the model's size: MediaPipe resizes nothing)."""
    mp = pytest.importorskip("mediapipe")
    from mediapipe.tasks.python import BaseOptions, vision

    _, path = fine_tuned
    runner = TFLiteRunner(path)
    class_names = data.load_dataset("cifar10-mini").class_names  # the new head's, as trained
    options = vision.ImageClassifierOptions(base_options=BaseOptions(model_asset_path=path))
    with vision.ImageClassifier.create_from_options(options) as classifier:
        for image in _images(image_folder, 3):
            pixels = np.asarray(Image.open(image).convert("RGB"))
            result = classifier.classify(mp.Image(image_format=mp.ImageFormat.SRGB, data=pixels))
            top = result.classifications[0].categories[0]
            probabilities = runner.predict(pixels[None].astype(np.float32))[0]
            assert top.index == int(np.argmax(probabilities)), image.name
            assert top.category_name == class_names[top.index]
            assert top.score == pytest.approx(float(probabilities.max()), abs=1e-5)
