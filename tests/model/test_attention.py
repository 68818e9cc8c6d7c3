"""Attention weights and attention rollout."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.model.vit.attention import AttentionRollout, attention_scores, rollout
from keras_vit.model.vit.layers import TransformerBlock


def _numpy_rollout(scores, grid, residual_weight=0.5, prefix=1):
    result = None
    for block in scores:
        mixed = np.asarray(block).mean(axis=1)
        mixed = (1 - residual_weight) * mixed + residual_weight * np.eye(mixed.shape[-1])
        mixed /= mixed.sum(-1, keepdims=True)
        result = mixed if result is None else mixed @ result
    maps = result[:, 0, prefix:].reshape(-1, *grid)
    return maps / maps.max(axis=(1, 2), keepdims=True)


@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_rollout_matches_a_numpy_reference_and_probabilities_match_the_model(tiny_config, images, pooling):
    model = keras_vit.ViT(**tiny_config, pooling=pooling)
    outputs = AttentionRollout(model)(images)
    np.testing.assert_allclose(outputs["probabilities"], keras.ops.softmax(model(images)), atol=1e-6)
    _, scores = attention_scores(model, images)
    assert len(scores) == tiny_config["depth"] and tuple(scores[0].shape) == (2, 4, 65, 65)
    np.testing.assert_allclose(np.asarray(scores[0]).sum(-1), 1.0, atol=1e-5)  # softmax rows
    maps = np.asarray(outputs["attention"])
    assert maps.shape == (2, 8, 8) and np.allclose(maps.max(axis=(1, 2)), 1.0)
    np.testing.assert_allclose(maps, _numpy_rollout(scores, (8, 8)), atol=1e-5)


def test_a_distilled_deit_maps_the_patches_past_both_prefix_tokens(tiny_config, images):
    model = keras_vit.ViT(**tiny_config, distillation_token=True)
    outputs = AttentionRollout(model)(images)
    np.testing.assert_allclose(outputs["probabilities"], keras.ops.softmax(model(images)), atol=1e-6)
    _, scores = attention_scores(model, images)
    assert tuple(scores[0].shape) == (2, 4, 66, 66)  # [cls], distillation token, 64 patches
    expected = _numpy_rollout(scores, (8, 8), prefix=2)
    np.testing.assert_allclose(outputs["attention"], expected, atol=1e-5)


def test_a_model_without_cls_follows_the_mean_of_its_patch_tokens(tiny_config, images):
    model = keras_vit.ViT(**tiny_config, class_token=False, pooling="gap", register_tokens=2)
    outputs = AttentionRollout(model)(images)
    _, scores = attention_scores(model, images)
    result = None
    for block in scores:  # the numpy reference, followed from the patch rows
        mixed = 0.5 * np.asarray(block).mean(axis=1) + 0.5 * np.eye(66)
        mixed /= mixed.sum(-1, keepdims=True)
        result = mixed if result is None else mixed @ result
    expected = result[:, 2:, 2:].mean(axis=1).reshape(-1, 8, 8)
    np.testing.assert_allclose(
        outputs["attention"], expected / expected.max(axis=(1, 2), keepdims=True), atol=1e-5
    )


@pytest.mark.parametrize("include_prefix", [False, True])
def test_a_map_head_follows_its_probe_through_the_blocks_and_exports(tiny_config, images, include_prefix):
    """SigLIP's head: the probe's head-averaged attention over the tokens it reads (computed here
    from the pooling's weights) times the blocks' rollout, over the patches; past 2 registers,
    which the probe reads too with timm's `pool_include_prefix`. The map exports with builtins."""
    from ai_edge_litert.interpreter import Interpreter

    from export import tflite
    from keras_vit.inference.classifier import load_classifier

    model = keras_vit.ViT(
        **tiny_config, class_token=False, pooling="map", register_tokens=2, pool_include_prefix=include_prefix
    )
    outputs = AttentionRollout(model)(images)
    np.testing.assert_allclose(outputs["probabilities"], keras.ops.softmax(model(images)), atol=1e-6)
    _, scores = attention_scores(model, images)
    result = None
    for block in scores:
        mixed = 0.5 * np.asarray(block).mean(axis=1) + 0.5 * np.eye(66)
        mixed /= mixed.sum(-1, keepdims=True)
        result = mixed if result is None else mixed @ result
    pooling = model.get_layer("pooling")
    read = np.asarray(keras.Model(model.inputs, pooling.input)(images))[:, 0 if include_prefix else 2 :]
    heads, width = pooling.num_heads, pooling.hidden_dim // pooling.num_heads
    query = (
        np.asarray(pooling.latent)[0] @ np.asarray(pooling.q.kernel) + np.asarray(pooling.q.bias)
    ).reshape(heads, width)
    keys = (read @ np.asarray(pooling.kv.kernel) + np.asarray(pooling.kv.bias))[..., : heads * width]
    logits = np.einsum("hd,bthd->bht", query, keys.reshape(2, -1, heads, width)) * width**-0.5
    probe = np.exp(logits - logits.max(-1, keepdims=True))
    probe = (probe / probe.sum(-1, keepdims=True)).mean(axis=1)  # (batch, tokens read)
    expected = np.einsum("bt,btk->bk", probe, result[:, 0 if include_prefix else 2 :])[:, 2:].reshape(
        -1, 8, 8
    )
    np.testing.assert_allclose(
        outputs["attention"], expected / expected.max(axis=(1, 2), keepdims=True), atol=1e-5
    )
    with_attention = Interpreter(model_content=tflite.convert_with_attention(load_classifier(model)))
    with_attention.allocate_tensors()
    assert sorted(tuple(d["shape"]) for d in with_attention.get_output_details()) == [(1, 8, 8), (1, 10)]


def test_one_block_with_pure_attention_is_that_blocks_cls_row():
    scores = np.random.default_rng(0).dirichlet(np.ones(5), size=(1, 2, 5)).astype("float32")
    maps = np.asarray(rollout([scores], (2, 2), residual_weight=0.0))
    expected = scores.mean(axis=1)[0, 0, 1:].reshape(2, 2)
    np.testing.assert_allclose(maps[0], expected / expected.max(), atol=1e-6)


def test_blocks_return_attention_scores_symbolically_too():
    tokens = keras.Input((5, 32))
    out, scores = TransformerBlock(32, 4, 64)(tokens, return_attention_scores=True)
    assert tuple(out.shape) == (None, 5, 32) and tuple(scores.shape) == (None, 4, 5, 5)


def test_rollout_needs_a_vit():
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="not a ViT"):
        AttentionRollout(plain)
