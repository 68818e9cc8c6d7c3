"""Hugging Face transformers' DINOv2, SigLIP and CLIP layouts against transformers itself: a tiny
random instance of each class, built by transformers and written with `save_pretrained` beside
its image processor's `preprocessor_config.json`, served by the stand-in hub (conftest) as
`hf-hub:tests/<name>`, loaded by keras-vit; each keeps transformers' meaning of its output."""

import json
import shutil

import keras
import numpy as np
import pytest
import torch
from conftest import HUB

import keras_vit
from keras_vit.model.state import CheckpointMismatchError

transformers = pytest.importorskip("transformers")

# Tiny: 2 blocks of width 32, 2 heads, patches of 8 on a 32x32 config (a 4x4 grid).
TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=99)
# Each processor's own normalisation, so a model that ignored it would fail.
MEAN, STD = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
# Another size than the repo's: transformers resamples the position embeddings at each call, keras-vit
# once at load, from the checkpoint's grid, with transformers' kernel.
OTHER_SIZE = 40


def _dinov2_processor(crop):
    # DINOv2's: the shorter side resized, then a centre crop (here smaller than the config's 32:
    # transformers resamples the position embeddings to the crop's 3x3 grid).
    return transformers.BitImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": crop, "width": crop}, image_mean=MEAN, image_std=STD
    )


def _clip_processor():
    return transformers.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, image_mean=MEAN, image_std=STD
    )


def _siglip_processor():
    return transformers.SiglipImageProcessor(size={"height": 32, "width": 32}, image_mean=MEAN, image_std=STD)


def _pooled(model, x, **kwargs):
    return model(pixel_values=x, **kwargs).pooler_output


def _siglip_pooled(model, x, **kwargs):
    return model.vision_model(pixel_values=x, **kwargs).pooler_output


def _clip_image_embeds(model, x, **kwargs):
    """CLIPModel's `get_image_features`: the projection of the pooled [cls] (not yet divided by
    its norm, as CLIPModel's forward does)."""
    features = model.get_image_features(pixel_values=x, **kwargs)
    return getattr(features, "pooler_output", features)


def _clip_pooled(model, x, **kwargs):
    return model.vision_model(pixel_values=x, **kwargs).pooler_output


# (kind, transformers model, its processor, its output, the pooled vector before any head,
# whether transformers needs interpolate_pos_encoding=True at another size, the pooling keras-vit
# gives it).
KINDS = {
    "dinov2": (
        lambda: transformers.Dinov2Model(transformers.Dinov2Config(**TOWER)),
        lambda: _dinov2_processor(24), _pooled, _pooled, False, "token",
    ),
    "dinov2 swiglu": (  # dinov2-giant's SwiGLU FFN
        lambda: transformers.Dinov2Model(transformers.Dinov2Config(**TOWER, use_swiglu_ffn=True)),
        lambda: _dinov2_processor(32), _pooled, _pooled, False, "token",
    ),
    "dinov2 registers": (
        lambda: transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(**TOWER, num_register_tokens=2)
        ),
        lambda: _dinov2_processor(24), _pooled, _pooled, False, "token",
    ),
    "siglip vision": (
        lambda: transformers.SiglipVisionModel(
            transformers.SiglipVisionConfig(**TOWER, intermediate_size=64)
        ),
        _siglip_processor, _pooled, _pooled, True, "map",
    ),
    "siglip": (
        lambda: transformers.SiglipModel(
            transformers.SiglipConfig(vision_config=dict(TOWER, intermediate_size=64), text_config=TEXT)
        ),
        _siglip_processor, _siglip_pooled, _siglip_pooled, True, "map",
    ),
    "clip vision": (
        lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**TOWER, intermediate_size=64)),
        _clip_processor, _pooled, _pooled, True, "token",
    ),
    "clip": (
        lambda: transformers.CLIPModel(
            transformers.CLIPConfig(
                vision_config=dict(TOWER, intermediate_size=64), text_config=TEXT, projection_dim=16
            )
        ),
        _clip_processor, _clip_image_embeds, _clip_pooled, True, "token",
    ),
}  # fmt: skip


def _repo(kind):
    return "tests/transformers-" + kind.replace(" ", "-")


# Parameters set far from their initial values: norms, LayerScales, registers and the probe would
# be the identity or nothing, and position tables small enough to hide a wrong resampling kernel.
PERTURBED = ("norm", "lambda1", "register", "probe", "class_embedding", "position")


@pytest.fixture(scope="module")
def references():
    """Each kind's transformers model (random, `PERTURBED` too), written once as a hub repo."""
    built = {}
    for i, (kind, (make, processor, *_)) in enumerate(KINDS.items()):
        torch.manual_seed(i)
        model = make().eval()
        with torch.no_grad():
            for key, parameter in model.named_parameters():
                if any(part in key for part in PERTURBED):
                    parameter.copy_(torch.randn_like(parameter) * 0.5 + (1 if "weight" in key else 0))
        folder = HUB.repo_folder(_repo(kind))
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder)
        processor().save_pretrained(folder)
        built[kind] = model
    return built


def _pixels(size, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (2, size, size, 3)).astype("float32")


def _torch_input(pixels):
    x = (pixels / 255 - np.array(MEAN)) / np.array(STD)
    return torch.from_numpy(x.transpose(0, 3, 1, 2)).float()


def _reference(kind, model, pixels, output=2, other_size=False):
    interpolate = dict(interpolate_pos_encoding=True) if other_size and KINDS[kind][4] else {}
    with torch.no_grad():
        return KINDS[kind][output](model, _torch_input(pixels), **interpolate).numpy()


@pytest.mark.parametrize("kind", KINDS)
def test_a_transformers_layout_gives_transformers_output(kind, references, hub_cache, record_parity):
    """`pooler_output` (CLIPModel: `image_embeds`, the projection), at the processor's size."""
    model = keras_vit.create_model(f"hf-hub:{_repo(kind)}", pretrained=True)
    assert model.pooling == KINDS[kind][5]
    assert model.include_top == (kind == "clip")  # CLIPModel's visual_projection is its head
    pixels = _pixels(model.image_size[0], seed=1)
    difference = np.abs(np.asarray(model(pixels)) - _reference(kind, references[kind], pixels)).max()
    output = "image_embeds" if kind == "clip" else "pooler_output"
    record_parity(f"transformers {kind} (tiny), {output}", difference, 1e-4)
    assert difference < 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_a_transformers_layout_at_another_size_resamples_as_transformers(
    kind, references, hub_cache, record_parity
):
    """transformers resamples its 4x4 grid of position embeddings to 5x5 (CLIP and SigLIP with
    `interpolate_pos_encoding=True`): bicubic without antialiasing, DINOv2 with registers with."""
    model = keras_vit.create_model(f"hf-hub:{_repo(kind)}", pretrained=True, image_size=OTHER_SIZE)
    pixels = _pixels(OTHER_SIZE, seed=2)
    expected = _reference(kind, references[kind], pixels, other_size=True)
    difference = np.abs(np.asarray(model(pixels)) - expected).max()
    record_parity(f"transformers {kind} (tiny) at {OTHER_SIZE}x{OTHER_SIZE}", difference, 1e-4)
    assert difference < 1e-4


@pytest.mark.parametrize(
    "kind, size, crop_pct, crop_mode",
    [
        ("dinov2", 24, 0.75, "center"),  # shorter side to 32, the centre 24x24
        ("dinov2 registers", 24, 0.75, "center"),
        ("siglip", 32, 1.0, "squash"),  # 32x32, no crop
        ("clip vision", 32, 1.0, "center"),
    ],
)
def test_the_repos_image_processor_is_the_input_contract(
    kind, size, crop_pct, crop_mode, references, hub_cache
):
    model = keras_vit.create_model(f"hf-hub:{_repo(kind)}", pretrained=True)
    assert tuple(model.image_size) == (size, size)
    np.testing.assert_allclose(model.image_mean, MEAN)
    np.testing.assert_allclose(model.image_std, STD)
    assert (model.crop_pct, model.crop_mode, model.interpolation) == (crop_pct, crop_mode, "bicubic")


@pytest.mark.parametrize("kind", ["dinov2 registers", "siglip", "clip"])
def test_num_classes_gives_a_new_head_on_the_pretrained_tower(kind, references, hub_cache, tmp_path):
    """A new head (CLIPModel's projection replaced) on the tower's pooled vector, as transformers
    gives it; the model survives a `.keras` round trip."""
    model = keras_vit.create_model(f"hf-hub:{_repo(kind)}", pretrained=True, num_classes=5)
    assert model.include_top and model.num_classes == 5 and model.class_names is None
    pixels = _pixels(model.image_size[0], seed=3)
    pooled = keras.Model(model.inputs[0], model.get_layer("head").input)(pixels)
    difference = np.abs(np.asarray(pooled) - _reference(kind, references[kind], pixels, output=3)).max()
    assert difference < 1e-4
    path = tmp_path / "tuned.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert (loaded.crop_pct, loaded.image_mean) == (model.crop_pct, model.image_mean)
    np.testing.assert_allclose(np.asarray(loaded(pixels)), np.asarray(model(pixels)), atol=1e-6)


def test_clip_image_embeds_are_clipmodels_before_its_normalisation(references, hub_cache):
    """CLIPModel's forward divides the projection by its norm; keras-vit gives the projection."""
    model = keras_vit.create_model(f"hf-hub:{_repo('clip')}", pretrained=True)
    pixels = _pixels(32, seed=4)
    with torch.no_grad():
        normalised = references["clip"](
            input_ids=torch.zeros((1, 3), dtype=torch.long), pixel_values=_torch_input(pixels)
        ).image_embeds.numpy()
    embeds = np.asarray(model(pixels))
    np.testing.assert_allclose(embeds / np.linalg.norm(embeds, axis=-1, keepdims=True), normalised, atol=1e-5)


def test_a_siglip_without_its_head_gives_every_token(hub_cache, record_parity):
    """`vision_use_head=False`: transformers gives no `pooler_output`; keras-vit every token
    after the final norm (its `last_hidden_state`)."""
    torch.manual_seed(9)
    reference = transformers.SiglipVisionModel(
        transformers.SiglipVisionConfig(**TOWER, intermediate_size=64, vision_use_head=False)
    ).eval()
    folder = HUB.repo_folder("tests/transformers-siglip-headless")
    shutil.rmtree(folder, ignore_errors=True)
    reference.save_pretrained(folder)
    _siglip_processor().save_pretrained(folder)
    model = keras_vit.create_model("hf-hub:tests/transformers-siglip-headless", pretrained=True)
    assert model.pooling == "none"
    pixels = _pixels(32, seed=5)
    with torch.no_grad():
        expected = reference(pixel_values=_torch_input(pixels)).last_hidden_state.numpy()
    difference = np.abs(np.asarray(model(pixels)) - expected).max()
    record_parity("transformers siglip vision without head (tiny), last_hidden_state", difference, 1e-4)
    assert difference < 1e-4


def test_a_transformers_class_of_another_head_is_refused_in_one_line(references, hub_cache):
    folder = HUB.repo_folder("tests/transformers-dinov2-classifier")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(HUB.repo_folder(_repo("dinov2")), folder)
    config_path = f"{folder}/config.json"
    with open(config_path) as f:
        config = json.load(f)
    config["architectures"] = ["Dinov2ForImageClassification"]
    with open(config_path, "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError) as error:
        keras_vit.create_model("hf-hub:tests/transformers-dinov2-classifier", pretrained=True)
    message = str(error.value)
    assert "\n" not in message
    assert "Dinov2ForImageClassification" in message and "Dinov2Model" in message


def test_a_checkpoint_missing_a_key_names_it(references, hub_cache):
    from safetensors.numpy import load_file, save_file

    folder = HUB.repo_folder("tests/transformers-clip-truncated")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(HUB.repo_folder(_repo("clip vision")), folder)
    weights = f"{folder}/model.safetensors"
    state = load_file(weights)
    del state["pre_layrnorm.weight"]
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatchError, match="norm_pre.weight"):
        keras_vit.create_model("hf-hub:tests/transformers-clip-truncated", pretrained=True)


@pytest.mark.parametrize("kind", KINDS)
def test_training_from_a_transformers_repo_builds_its_architecture(kind, references, hub_cache):
    """`keras-vit train --weights hf-hub:...` builds the nearest named architecture with what the
    repo's says otherwise: every part the same as the loaded model's (no hybrid stem or other
    part of the named one left over)."""
    from keras_vit.model import registry
    from keras_vit.model.vit.architecture import ARGUMENTS, Architecture
    from keras_vit.training.config import TrainConfig

    config = TrainConfig(dataset="unused", weights=f"hf-hub:{_repo(kind)}").resolved()
    trained = dict(registry.get_model_config(config.model), **config.overrides)
    loaded = keras_vit.create_model(f"hf-hub:{_repo(kind)}", pretrained=True).get_config()
    trained, loaded = (
        Architecture(**{key: arguments[key] for key in ARGUMENTS if key in arguments}).config()
        for arguments in (trained, loaded)
    )
    own = {"num_classes", "class_names", "include_top", "image_size", "image_mean", "image_std", "license"}
    differ = {key for key in ARGUMENTS if key not in own and trained[key] != loaded[key]}
    assert not differ, {key: (trained[key], loaded[key]) for key in sorted(differ)}
    assert config.image_size == loaded["image_size"][0]
    np.testing.assert_allclose(config.image_mean, MEAN)


@pytest.mark.parametrize("kind", KINDS)
def test_a_transformers_layout_publishes_for_timm_with_the_same_outputs(
    kind, references, hub_cache, tmp_path
):
    """`save_pretrained` writes a model read from transformers' layout in timm's (the nearest
    architecture, `model_args` for the rest, the processor's normalisation and crop), and timm
    builds it with keras-vit's outputs: CLIPModel's projection is its head."""
    timm = pytest.importorskip("timm")
    model = keras_vit.create_model(f"hf-hub:{_repo(kind)}", pretrained=True)
    folder = keras_vit.save_pretrained(model, tmp_path / "published")
    by_timm = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    config = by_timm.pretrained_cfg
    np.testing.assert_allclose(config["mean"], MEAN)
    np.testing.assert_allclose(config["std"], STD)
    assert tuple(config["input_size"][1:]) == tuple(model.image_size)
    pixels = _pixels(model.image_size[0], seed=4)
    with torch.no_grad():
        by_timm_outputs = by_timm(_torch_input(pixels)).numpy()
    assert np.abs(np.asarray(model(pixels)) - by_timm_outputs).max() < 1e-4
