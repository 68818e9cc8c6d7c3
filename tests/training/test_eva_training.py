"""Training an Eva (timm's `eva` module): layer decay and weight decay grouped as timm groups
them, the mixed kind's rotary frequencies learned, `--remat` on JAX with the rotary table as an
input, and `keras-vit train` on a tiny DINOv3 by name. Tiny configs."""

import keras
import numpy as np
import pytest

import keras_vit

# Tiny: 2 blocks of width 64, 2 heads.
SMALL = dict(depth=2, embed_dim=64, num_heads=2)


def _pixels(size, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (2, size, size, 3)).astype("float32")


def test_an_eva_trains_and_learns_its_rotary_frequencies():
    """The mixed kind's frequencies get gradients through every block, augmented positions,
    stochastic depth and all."""
    model = keras_vit.Eva(
        image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3, use_rot_pos_emb=True,
        rope_type="mixed", attn_type="rope", rope_rescale_coords=2.0, drop_path_rate=0.1,
    )  # fmt: skip
    before = np.asarray(model.get_layer("rope").freqs)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(_pixels(32), np.array([0, 2]), epochs=2, batch_size=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert np.abs(np.asarray(model.get_layer("rope").freqs) - before).max() > 0


_REMAT = """
import numpy as np, keras, keras_vit
def losses(remat):
    keras.utils.set_random_seed(0)
    model = keras_vit.Eva(image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3,
                          use_rot_pos_emb=True, rope_type="mixed", attn_type="rope")
    for block in model.blocks:
        block.rematerialise = remat
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype("float32")
    return model.fit(x, np.array([0, 1, 2, 0]), epochs=3, batch_size=4, verbose=0).history["loss"]
np.testing.assert_allclose(losses(True), losses(False), rtol=1e-5)
# Called eagerly on JAX: EVA02's fused QKV with its own q and v biases, pooled by [cls], and what
# its exports run (the last block on [cls] alone) gives the same logits.
from keras_vit.model.registry import family_of
model = keras_vit.Eva(image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3,
                      use_rot_pos_emb=True, global_pool="token")
rng = np.random.default_rng(1)
model.set_weights([rng.normal(0, 0.3, w.shape).astype("float32") for w in model.get_weights()])
x = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
forward = family_of(model).classifier_forward(model)
assert forward is not model
np.testing.assert_allclose(forward(x), model(x), atol=1e-5)
"""


def test_remat_recomputes_an_evas_blocks_with_the_rotary_table_as_an_input_on_jax():
    """`--remat` (JAX): the learned rotary table enters each recomputed block as a differentiated
    input, not a closed-over value; the losses are those without recomputation. In the same
    process, an EVA02 (its own q and v biases) called eagerly, and its exports' forward."""
    import os
    import subprocess
    import sys

    environment = dict(os.environ, KERAS_BACKEND="jax")
    result = subprocess.run([sys.executable, "-c", _REMAT], env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(
    "name", ["vit_small_patch16_rope_mixed_ape_224", "vit_pe_core_tiny_patch16_384", "eva02_base_patch14_224"]
)
def test_layer_decay_and_weight_decay_group_the_weights_as_timm_does(name):
    """timm's `param_groups_layer_decay` (its group_matcher, no_weight_decay and 1-d rule) gives
    each weight a learning-rate scale and a weight decay; keras-vit's AdamW gives the same."""
    import timm.optim

    from keras_vit.model.registry import family_of
    from keras_vit.model.state import linear
    from keras_vit.training.optimizers import layer_decay_multipliers

    size = 56 if "patch14" in name else 64
    reference = timm.create_model(name, num_classes=3, img_size=size, **SMALL)
    groups = timm.optim.param_groups_layer_decay(
        reference, weight_decay=0.05, layer_decay=0.5, no_weight_decay_list=reference.no_weight_decay()
    )
    names = {id(p): n for n, p in reference.named_parameters()}
    timm_scale = {names[id(p)]: group["lr_scale"] for group in groups for p in group["params"]}
    timm_decays = {names[id(p)]: group["weight_decay"] > 0 for group in groups for p in group["params"]}
    model = keras_vit.create_model(name, num_classes=3, image_size=size, **SMALL)
    family = family_of(model)
    multipliers = layer_decay_multipliers(model, 0.5)
    optimizer = keras_vit.optimizers.AdamW(learning_rate=1e-3, weight_decay=0.05, lr_multipliers=multipliers)
    optimizer.exclude_from_weight_decay(var_names=list(family.no_weight_decay))
    checkpoint = family.checkpoint()
    pairs = checkpoint.targets(model) + [
        t for p, layer in checkpoint.optional_layers(model) for t in linear(layer, p)
    ]
    keys = {variable.path: key for key, variable, _ in pairs}
    assert len(keys) == len(model.trainable_variables) == len(timm_scale)
    for variable in model.trainable_variables:
        key = keys[variable.path]
        scale = multipliers.get(variable.path.split("/", 1)[0], 1.0)
        assert scale == pytest.approx(timm_scale[key]), (variable.path, key)
        assert optimizer._use_weight_decay(variable) == timm_decays[key], (variable.path, key)


def test_keras_vit_train_fine_tunes_an_eva_by_name_with_layer_decay_and_exports_it(tmp_path, colors_dataset):
    """The command line on a (tiny) DINOv3: trained with layer decay, EMA and mixed precision,
    saved, reloaded and exported to TFLite with the attention map."""
    from keras_vit.cli import main
    from keras_vit.storage.saving import load_trained_model

    run = tmp_path / "dinov3"
    tiny = ["--override=embed_dim=32", "--override=depth=2", "--override=num_heads=2"]
    common = ["--dataset", colors_dataset, "--image-size", "32", "--batch-size", "8", "--epochs", "1"]
    extra = ["--layer-decay", "0.75", "--ema", "0.9", "--precision", "mixed_bfloat16"]
    assert (
        main(["train", "--model", "vit_small_patch16_dinov3", *tiny, *common, *extra, "--output", str(run)])
        == 0
    )
    model = load_trained_model(str(run))
    assert model.family == "eva" and model.rope_type == "dinov3" and model.image_size == (32, 32)
    exports = tmp_path / "exports"
    assert main(["export", str(run), "--format", "tflite", "--attention", "--output", str(exports)]) == 0
