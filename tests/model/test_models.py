import inspect
import json

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

import keras_vit
from keras_vit.model.vit.configs import MODEL_CONFIGS

TIMM_NAMES = [
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_small_patch32_224",
    "vit_base_patch16_224",
    "vit_base_patch32_224",
    "vit_base_patch16_384",
    "vit_large_patch16_224",
    "vit_large_patch32_224",
    "vit_huge_patch14_224",
]


def test_list_models_has_the_timm_names_and_small_image_configs():
    names = keras_vit.list_models()
    assert set(TIMM_NAMES) <= set(names)
    small = [n for n in names if n in MODEL_CONFIGS and MODEL_CONFIGS[n]["image_size"] == 32]
    assert {MODEL_CONFIGS[n]["patch_size"] for n in small} == {2, 4}


def test_unknown_config_name_is_a_clear_error_with_suggestions():
    with pytest.raises(
        ValueError, match=r"Unknown model config 'vit_base_patch16_244'.*vit_base_patch16_224"
    ):
        keras_vit.create_model("vit_base_patch16_244")


def test_unknown_override_is_a_clear_error():
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['num_class'\]"):
        keras_vit.create_model("vit_mini_patch4_32", num_class=10)


def test_overrides_change_the_model(images):
    model = keras_vit.create_model(
        "vit_mini_patch4_32", num_classes=7, dropout=0.1, drop_path_rate=0.2, pooling="gap"
    )
    assert model(images).shape == (2, 7)
    assert model.get_layer("pooling").mode == "gap"
    rates = [block.drop_path_rate for block in model.blocks]
    np.testing.assert_allclose(rates, np.linspace(0, 0.2, 6))

    gray = keras_vit.create_model("vit_mini_patch4_32", channels=1, image_size=48, include_top=False)
    assert gray(np.zeros((3, 48, 48, 1), "float32")).shape == (3, 192)


def test_invalid_architectures_name_the_problem():
    with pytest.raises(ValueError, match=r"12x12.*smaller than one 16x16 patch"):
        keras_vit.create_model("vit_tiny_patch16_224", image_size=12)
    with pytest.raises(ValueError, match=r"num_heads=5 does not divide hidden_dim=192"):
        keras_vit.create_model("vit_tiny_patch16_224", num_heads=5)
    with pytest.raises(ValueError, match=r"drop_path_rate must be in \[0, 1\)"):
        keras_vit.create_model("vit_tiny_patch16_224", drop_path_rate=1.5)


def test_wrong_image_size_names_both_shapes(tiny_config):
    model = keras_vit.ViT(**tiny_config)
    with pytest.raises(ValueError, match=r"expected shape=\(None, 32, 32, 3\), found shape=\(1, 64, 64, 3\)"):
        model(np.zeros((1, 64, 64, 3), "float32"))


def _timm_vit_on_meta(name):
    """timm's VisionTransformer with a config's architecture, shapes only: even ViT-H costs nothing."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("timm")
    from timm.models.vision_transformer import VisionTransformer

    c = MODEL_CONFIGS[name]
    with torch.device("meta"):
        return VisionTransformer(
            img_size=c["image_size"],
            patch_size=c["patch_size"],
            embed_dim=c["hidden_dim"],
            depth=c["depth"],
            num_heads=c["num_heads"],
            mlp_ratio=c["mlp_dim"] / c["hidden_dim"],
            num_classes=1000,
            weight_init="skip",  # shapes only (timm_reference.on_meta)
        ).eval()


def _timm_parameter_count(name):
    timm = pytest.importorskip("timm")
    pytest.importorskip("torch")
    from timm_reference import on_meta

    if name in timm.list_models():  # timm's own registered config, where it has one
        model = on_meta(name, num_classes=1000)
    else:
        model = _timm_vit_on_meta(name)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(MODEL_CONFIGS))
def test_parameter_count_equals_timm(name):
    assert keras_vit.parameter_count(name) == _timm_parameter_count(name)


def test_vit_base_patch16_224_has_timms_parameter_count():
    model = keras_vit.create_model("vit_base_patch16_224")
    assert model.count_params() == 86_567_656


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("vit_tiny_patch16_224", {}),
        ("vit_small_patch32_224", {"num_classes": 10}),
        ("vit_mini_patch4_32", {"pooling": "gap", "channels": 1}),
        ("vit_mini_patch4_32", {"representation_size": 64, "image_size": 48}),
        ("vit_mini_patch4_32", {"include_top": False}),
        ("vit_mini_patch4_32", {"layer_scale": 1e-6, "cls_position_embedding": False}),
        ("vit_mini_patch4_32", {"distillation_token": True, "num_classes": 10}),
        ("vit_mini_patch4_32", {"class_token": False, "pooling": "gap", "register_tokens": 4}),
    ],
)
def test_analytic_parameter_count_equals_the_built_model(name, overrides):
    model = keras_vit.create_model(name, **overrides)
    assert model.count_params() == keras_vit.parameter_count(model)
    assert keras_vit.parameter_count(name, **overrides) == model.count_params()


@pytest.mark.parametrize(
    "name",
    [
        "vit_tiny_patch16_224",
        "vit_small_patch32_224",
        "vit_mini_patch4_32",
        "deit_tiny_distilled_patch16_224",
        "deit3_small_patch16_224",
        "vit_medium_patch16_reg4_gap_256",
    ],
)
def test_forward_flops_equal_pytorchs_flop_counter_on_timm(name):
    torch = pytest.importorskip("torch")
    timm = pytest.importorskip("timm")
    from timm_reference import on_meta
    from torch.utils.flop_counter import FlopCounterMode

    if name in timm.list_models():
        model = on_meta(name).eval()
    else:
        model = _timm_vit_on_meta(name)
    size = MODEL_CONFIGS[name]["image_size"]
    counter = FlopCounterMode(display=False)
    with torch.device("meta"), counter, torch.no_grad():
        model(torch.empty(1, 3, size, size))
    assert keras_vit.forward_flops(name) == counter.get_total_flops()
    assert keras_vit.training_flops(name) == 3 * counter.get_total_flops()


def test_keras_round_trip_gives_identical_outputs(tmp_path, tiny_config, images):
    model = keras_vit.ViT(
        **tiny_config,
        pooling="gap",
        representation_size=16,
        dropout=0.1,
        drop_path_rate=0.1,
        classifier_activation="softmax",
    )
    path = tmp_path / "vit.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert isinstance(restored, keras_vit.ViT)
    assert restored.get_config() == model.get_config()
    np.testing.assert_array_equal(to_numpy(restored(images)), to_numpy(model(images)))
    np.testing.assert_allclose(to_numpy(restored(images)).sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "layout",
    [
        dict(layer_scale=0.1, cls_position_embedding=False),
        dict(distillation_token=True),
        dict(class_token=False, pooling="gap", register_tokens=4, norm_before_pooling=True),
    ],
)
def test_deit_and_register_layouts_survive_a_keras_round_trip_and_a_resize(
    tmp_path, tiny_config, images, layout
):
    model = keras_vit.ViT(**tiny_config, **layout)
    model.save(tmp_path / "layout.keras")
    restored = keras.models.load_model(tmp_path / "layout.keras")
    assert restored.get_config() == model.get_config()
    prefix = 0 if not model.cls_position_embedding else model.get_layer("patch_encoder").num_prefix_tokens
    assert restored.get_layer("patch_encoder").position_embedding.shape == (1, 64 + prefix, 32)
    resized = keras_vit.resize_model(model, image_size=32)  # same grid: the same model
    np.testing.assert_allclose(to_numpy(resized(images)), to_numpy(model(images)), atol=1e-6)
    np.testing.assert_array_equal(to_numpy(restored(images)), to_numpy(model(images)))


def test_get_config_is_json_and_rebuilds_the_same_architecture(tiny_config):
    model = keras_vit.ViT(**tiny_config, dtype="mixed_bfloat16")
    arguments = inspect.signature(keras_vit.ViT.__init__).parameters
    assert set(arguments) - {"self", "kwargs"} <= set(model.get_config())
    config = json.loads(json.dumps(model.get_config()))
    rebuilt = keras_vit.ViT.from_config(config)
    assert rebuilt.get_config() == model.get_config()
    assert rebuilt.dtype_policy.name == "mixed_bfloat16"


def test_resize_model_resamples_positions_and_keeps_other_weights(tiny_config, images):
    model = keras_vit.ViT(**tiny_config)
    bigger = keras_vit.resize_model(model, 48)
    assert bigger(np.zeros((2, 48, 48, 3), "float32")).shape == (2, 10)
    old = to_numpy(model.get_layer("patch_encoder").position_embedding)
    new = to_numpy(bigger.get_layer("patch_encoder").position_embedding)
    assert new.shape == (1, 1 + 12 * 12, 32)
    np.testing.assert_allclose(new, keras_vit.resample_position_embeddings(old, (12, 12)))
    np.testing.assert_array_equal(
        to_numpy(bigger.get_layer("head").kernel), to_numpy(model.get_layer("head").kernel)
    )
    # Back at the original size nothing is resampled: the same function.
    same = keras_vit.resize_model(model, 32)
    np.testing.assert_array_equal(to_numpy(same(images)), to_numpy(model(images)))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_keeps_float32_weights_and_logits(tiny_config, images, policy):
    reference = keras_vit.ViT(**tiny_config)
    keras.config.set_dtype_policy(policy)
    mixed = keras_vit.ViT(**tiny_config)
    mixed.set_weights(reference.get_weights())
    out = mixed(images)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    assert mixed.get_layer("block_0").fc1.compute_dtype == policy.split("_")[1]
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in mixed.weights)
    np.testing.assert_allclose(to_numpy(out), to_numpy(reference(images)), atol=0.05)


def test_a_tiny_vit_learns_under_fit(tiny_config):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=16)
    model = keras_vit.ViT(**tiny_config, drop_path_rate=0.1)
    model.compile(
        optimizer=keras.optimizers.AdamW(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(x, y, batch_size=8, epochs=30, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.25 * losses[0]  # memorises 16 random images: gradients reach every layer


@pytest.mark.parametrize(
    "layout",
    [
        dict(pooling="gap", representation_size=16),
        dict(layer_scale=1e-6, cls_position_embedding=False),
        dict(distillation_token=True, classifier_activation="softmax"),
        dict(class_token=False, pooling="gap", register_tokens=4, cls_position_embedding=False),
    ],
    ids=["gap-pre-logits", "deit3", "distilled", "registers-gap"],
)
def test_converts_to_tflite_with_builtin_ops_only(tmp_path, tiny_config, layout):
    """Guards the layers against ops that would need Flex (e.g. `x[:, None]`)."""
    import tensorflow as tf

    model = keras_vit.ViT(**tiny_config, **layout)
    model.export(str(tmp_path / "saved_model"), format="tf_saved_model", verbose=False)
    converter = tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "saved_model"))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]  # fails on any Flex op
    flatbuffer = converter.convert()
    assert b"Flex" not in flatbuffer and len(flatbuffer) > model.count_params() * 4


def test_normalisation_and_class_names_travel_with_the_model(tmp_path, tiny_config):
    model = keras_vit.ViT(
        **tiny_config, image_mean=[0.5] * 3, image_std=[0.25] * 3, class_names=[f"c{i}" for i in range(10)]
    )
    bare = keras_vit.ViT(**tiny_config)
    bare.set_weights(model.get_weights())
    pixels = np.random.default_rng(5).uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(
        to_numpy(model(pixels)), to_numpy(bare((pixels / 255 - 0.5) / 0.25)), atol=1e-5
    )
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras")
    assert restored.class_names == [f"c{i}" for i in range(10)]
    assert restored.image_std == [0.25] * 3
    with pytest.raises(ValueError, match="3 class_names given for num_classes=10"):
        keras_vit.ViT(**tiny_config, class_names=["a", "b", "c"])
    with pytest.raises(ValueError, match="Set both image_mean and image_std"):
        keras_vit.ViT(**tiny_config, image_mean=[0.5] * 3)


def test_the_vits_arguments_and_defaults_are_declared_once():
    """`ViT`'s signature (what `help` and IDEs show) and `complexity`'s defaults both come from
    `Architecture`'s fields: a new argument is added in one place."""
    import dataclasses
    import inspect

    from keras_vit.model.vit.architecture import ARGUMENTS, Architecture

    parameters = inspect.signature(keras_vit.ViT).parameters
    assert list(parameters) == [*ARGUMENTS, "dtype", "kwargs"]
    for field in dataclasses.fields(Architecture):
        assert parameters[field.name].default == field.default, field.name
    default = keras_vit.ViT(image_size=32, patch_size=16, hidden_dim=8, depth=1, num_heads=2, mlp_dim=8)
    assert (
        keras_vit.parameter_count(default)
        == keras_vit.parameter_count(
            dict(image_size=32, patch_size=16, hidden_dim=8, depth=1, num_heads=2, mlp_dim=8)
        )
        == default.count_params()
    )
