import inspect
import math

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_vit.model.layers import DropPath, ImageNormalization
from keras_vit.model.vit.layers import (
    AttentionPoolLatent,
    DifferentialAttention,
    MultiHeadSelfAttention,
    ParallelScalingBlock,
    PatchEncoder,
    Patches,
    RelativePositionBias,
    ResPostBlock,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.model.vit.stems import ResNetV2Bottleneck, ResNetV2Stem, StdConv2D


def _reference_patches(image, p):
    rows, cols = image.shape[0] // p, image.shape[1] // p
    return np.stack(
        [
            image[r * p : (r + 1) * p, c * p : (c + 1) * p].reshape(-1)
            for r in range(rows)
            for c in range(cols)
        ]
    )


# (30, 34): no multiple of 4, the last 2 rows and columns unread, as by timm's PatchEmbed.
@pytest.mark.parametrize(
    "shape,patch", [((32, 32, 3), 4), ((32, 48, 1), 8), ((12, 6, 2), 3), ((30, 34, 3), 4)]
)
def test_patches_are_row_major_and_flattened_like_a_conv_kernel(shape, patch):
    image = np.arange(np.prod(shape), dtype="float32").reshape(shape)
    out = to_numpy(Patches(patch)(image[None]))
    rows, cols = shape[0] // patch, shape[1] // patch
    assert out.shape == (1, rows * cols, patch * patch * shape[2])
    np.testing.assert_array_equal(out[0], _reference_patches(image, patch))


def test_patches_reject_a_side_shorter_than_a_patch():
    with pytest.raises(ValueError, match=r"3x32.*smaller than one 4x4 patch"):
        Patches(4)(np.zeros((1, 3, 32, 3), "float32"))


def test_the_patch_encoder_reads_whole_patches_as_its_convolution_and_the_patches_do():
    """An image side that is no multiple of the patch: the convolution reads the whole patches, as
    `Patches` times the same kernel does (timm's PatchEmbed at SigLIP-So400m/14's 384 px)."""
    images = np.random.default_rng(2).normal(size=(2, 30, 21, 3)).astype("float32")
    encoder = PatchEncoder(patch_size=8, hidden_dim=5, class_token=False)
    out = to_numpy(encoder(images))
    assert encoder.grid_size == (3, 2) and out.shape == (2, 6, 5)
    kernel = to_numpy(encoder.projection.kernel).reshape(8 * 8 * 3, 5)
    expected = to_numpy(Patches(8)(images)) @ kernel + to_numpy(encoder.projection.bias)
    np.testing.assert_allclose(out, expected + to_numpy(encoder.position_embedding), atol=1e-5)


def test_patch_encoder_is_patches_times_a_linear_map_plus_cls_and_positions():
    images = np.random.default_rng(1).normal(size=(2, 16, 24, 3)).astype("float32")
    encoder = PatchEncoder(patch_size=8, hidden_dim=5)
    out = to_numpy(encoder(images))
    assert out.shape == (2, 1 + 2 * 3, 5)
    kernel = to_numpy(encoder.projection.kernel).reshape(8 * 8 * 3, 5)
    bias = to_numpy(encoder.projection.bias)
    positions = to_numpy(encoder.position_embedding)[0]
    cls = to_numpy(encoder.cls_token)[0, 0]
    expected_patches = to_numpy(Patches(8)(images)) @ kernel + bias + positions[1:]
    np.testing.assert_allclose(out[:, 1:], expected_patches, atol=1e-5)
    np.testing.assert_allclose(out[:, 0], np.broadcast_to(cls + positions[0], (2, 5)), atol=1e-6)


def test_patch_encoder_names_both_sizes_when_called_at_another_resolution():
    encoder = PatchEncoder(patch_size=4, hidden_dim=8)
    encoder(np.zeros((1, 32, 32, 3), "float32"))
    with pytest.raises(ValueError, match=r"takes 32x32 images but got 48x48.*resize_model"):
        encoder(np.zeros((1, 48, 48, 3), "float32"))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x, layer):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + layer.epsilon) * to_numpy(layer.gamma) + to_numpy(layer.beta)


def _dense(x, layer):
    return x @ to_numpy(layer.kernel) + to_numpy(layer.bias)


def test_transformer_block_matches_a_numpy_pre_norm_block():
    x = np.random.default_rng(2).normal(size=(2, 5, 8)).astype("float32")
    block = TransformerBlock(hidden_dim=8, num_heads=2, mlp_dim=16)
    out = to_numpy(block(x))

    attn = block.attention
    q, k, v = np.split(_dense(_layer_norm(x, block.norm1), attn.qkv), 3, axis=-1)
    heads = lambda t: t.reshape(2, 5, 2, 4).transpose(0, 2, 1, 3)  # noqa: E731
    weights = _softmax(heads(q) @ heads(k).transpose(0, 1, 3, 2) / np.sqrt(4))
    attended = (weights @ heads(v)).transpose(0, 2, 1, 3).reshape(2, 5, 8)
    h = x + _dense(attended, attn.proj)
    hidden = _dense(_layer_norm(h, block.norm2), block.fc1)
    gelu = 0.5 * hidden * (1 + np.vectorize(math.erf)(hidden / np.sqrt(2)))
    expected = h + _dense(gelu, block.fc2)
    np.testing.assert_allclose(out, expected, atol=1e-5)

    _, scores = block(x, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(scores), weights, atol=1e-6)


def test_heads_must_divide_the_width():
    with pytest.raises(ValueError, match=r"num_heads=5 does not divide hidden_dim=32"):
        TransformerBlock(hidden_dim=32, num_heads=5, mlp_dim=64)


def test_drop_path_drops_whole_samples_in_training_only():
    x = np.ones((400, 3, 4), "float32")
    layer = DropPath(0.5, seed=1)
    np.testing.assert_array_equal(to_numpy(layer(x, training=False)), x)
    out = to_numpy(layer(x, training=True))
    per_sample = out.reshape(400, -1)
    # Each sample is either dropped entirely or kept and scaled by 1 / (1 - rate).
    assert set(np.unique(per_sample.min(axis=1))) <= {0.0, 2.0}
    np.testing.assert_array_equal(per_sample.min(axis=1), per_sample.max(axis=1))
    assert 0.35 < (per_sample[:, 0] == 0).mean() < 0.65


def test_token_pooling_takes_cls_or_averages_patch_tokens_only():
    x = np.random.default_rng(3).normal(size=(2, 5, 4)).astype("float32")
    np.testing.assert_allclose(to_numpy(TokenPooling("token")(x)), x[:, 0])
    np.testing.assert_allclose(to_numpy(TokenPooling("gap")(x)), x[:, 1:].mean(1), atol=1e-6)
    with pytest.raises(ValueError, match="pooling must be one of"):
        TokenPooling("max")


LAYERS = [
    (ImageNormalization, dict(mean=[0.1, 0.2, 0.3], std=[0.5, 0.6, 0.7])),
    (Patches, dict(patch_size=4)),
    (PatchEncoder, dict(patch_size=4, hidden_dim=16, dropout=0.1, projection_bias=False)),
    (PatchEncoder, dict(patch_size=4, hidden_dim=16, position_embedding=False)),
    (PatchEncoder, dict(patch_size=1, hidden_dim=16, stem="resnetv2", stem_depths=[1, 2])),
    (StdConv2D, dict(filters=8, kernel_size=(3, 3), strides=(2, 2), epsilon=1e-6)),
    (ResNetV2Bottleneck, dict(filters=64, strides=2, downsample=True)),
    (ResNetV2Stem, dict(depths=[2, 1])),
    (PatchEncoder, dict(patch_size=1, hidden_dim=16, stem="convstem")),
    (DifferentialAttention, dict(hidden_dim=16, num_heads=2, qkv_bias=False, depth=3)),
    (
        ParallelScalingBlock,
        dict(hidden_dim=16, num_heads=2, mlp_dim=40, qkv_bias=False, layer_scale=0.1, attention="diff"),
    ),
    (ParallelScalingBlock, dict(hidden_dim=16, num_heads=2, mlp_dim=40, activation="silu")),
    (
        RelativePositionBias,
        dict(kind="mlp", grid_size=[2, 3], num_heads=2, num_prefix_tokens=1, hidden_dim=8),
    ),
    (RelativePositionBias, dict(kind="table", grid_size=[3, 3], num_heads=2, num_prefix_tokens=1)),
    (
        ResPostBlock,
        dict(
            hidden_dim=16,
            num_heads=2,
            mlp_dim=32,
            layer_scale=1e-6,
            position_bias=dict(kind="table", grid_size=[2, 2], num_prefix_tokens=0, hidden_dim=128),
        ),
    ),
    (DropPath, dict(rate=0.2, seed=7)),
    (
        MultiHeadSelfAttention,
        dict(
            hidden_dim=16,
            num_heads=2,
            attention_dropout=0.1,
            dropout=0.2,
            qkv_bias=False,
            proj_bias=False,
            scale_norm=True,
            layer_norm_epsilon=1e-5,
        ),
    ),
    (
        TransformerBlock,
        dict(
            hidden_dim=16,
            num_heads=2,
            mlp_dim=32,
            dropout=0.1,
            attention_dropout=0.2,
            drop_path_rate=0.3,
            layer_norm_epsilon=1e-5,
            qkv_bias=False,
            proj_bias=False,
            activation="quick_gelu",
            mlp="swiglu_packed",
            scale_attention_norm=True,
            scale_mlp_norm=True,
        ),
    ),
    (TokenPooling, dict(mode="gap", num_prefix_tokens=1)),
    (
        AttentionPoolLatent,
        dict(
            hidden_dim=16,
            num_heads=2,
            mlp_dim=32,
            num_prefix_tokens=1,
            activation="gelu_tanh",
            layer_norm_epsilon=1e-5,
        ),
    ),
]


@pytest.mark.parametrize("cls,kwargs", LAYERS, ids=[c.__name__ for c, _ in LAYERS])
def test_get_config_returns_every_constructor_argument(cls, kwargs):
    layer = cls(**kwargs)
    config = layer.get_config()
    arguments = [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "kwargs")]
    for name in arguments:
        assert name in config, f"{cls.__name__}.get_config() lacks {name!r}"
    for name, value in kwargs.items():
        assert config[name] == value
    assert cls.from_config(config).get_config() == config


def test_layers_survive_a_keras_round_trip(tmp_path):
    inputs = keras.Input((16, 16, 3))
    x = PatchEncoder(4, 16, dropout=0.1)(inputs)
    x = TransformerBlock(16, 2, 32, drop_path_rate=0.1)(x)
    x = TransformerBlock(16, 2, 32, activation="silu", mlp="swiglu", qkv_bias=False)(x)
    x = TransformerBlock(16, 2, 32, position_bias=dict(kind="mlp", grid_size=[4, 4], num_prefix_tokens=1))(x)
    shared = RelativePositionBias("table", (4, 4), 2, num_prefix_tokens=1)(x)
    x = ResPostBlock(16, 2, 32, layer_scale=0.5)(x, position_bias=shared)
    x = TransformerBlock(16, 2, 32, attention="diff", depth=1)(x)
    x = ParallelScalingBlock(16, 2, 40, qkv_bias=False, attention="diff")(x)
    x = ParallelScalingBlock(16, 2, 40, layer_scale=0.1)(x)
    pooled = TokenPooling("gap")(x)
    attention_pooled = AttentionPoolLatent(16, 2, 32, num_prefix_tokens=1)(x)
    patches = Patches(4)(inputs)
    model = keras.Model(inputs, [pooled, attention_pooled, patches])
    images = np.random.default_rng(4).normal(size=(2, 16, 16, 3)).astype("float32")
    path = tmp_path / "layers.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    for before, after in zip(model(images), restored(images), strict=True):
        np.testing.assert_array_equal(to_numpy(before), to_numpy(after))


def test_sublayers_follow_the_mixed_precision_policy():
    block = TransformerBlock(16, 2, 32, dtype="mixed_bfloat16")
    out = block(np.zeros((1, 4, 16), "float32"))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert block.fc1.compute_dtype == "bfloat16"
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in block.weights)


def test_image_normalization_maps_pixels_to_normalised_values():
    layer = ImageNormalization(mean=[0.5, 0.25, 0.0], std=[0.5, 0.25, 1.0])
    pixels = np.array([[[[0.0, 255.0, 127.5]]]], "float32")
    expected = (pixels / 255.0 - np.array([0.5, 0.25, 0.0])) / np.array([0.5, 0.25, 1.0])
    np.testing.assert_allclose(to_numpy(layer(pixels)), expected, atol=1e-6)
    with pytest.raises(ValueError, match="std values must be positive"):
        ImageNormalization(mean=[0.5], std=[0.0])
