"""LoRA: Keras' low-rank adapters on the blocks the family names, the rest of the backbone
frozen, the head trained, and a merged model saved; backups that resume the adapters exactly."""

import re

import keras
import numpy as np
import pytest
from conftest import TINY

import keras_vit
from keras_vit.model import registry
from keras_vit.storage.saving import save_model
from keras_vit.training.lora import lora_layers

TINY_SWIN = dict(image_size=32, embed_dim=16, depths=(1, 1), num_heads=(1, 2), window_size=4, num_classes=10)


def _tiny(family):
    if family == "vit":
        return keras_vit.create_model("vit_nano_patch4_32", **TINY)
    return keras_vit.create_model("swin_tiny_patch4_window7_224", **TINY_SWIN)


def _adapted_parameters(model, rank, paths):
    """rank x (inputs + outputs) for each adapted Dense layer, and the whole head."""
    count = 0
    for variable in model.weights:
        layer = variable.path.rsplit("/", 1)[0]
        if variable.path.endswith("/kernel") and layer.endswith(paths) and "lora" not in variable.path:
            count += rank * sum(variable.shape)
    head = model.get_layer("head")
    return count + sum(int(np.prod(v.shape)) for v in head.weights)


@pytest.mark.parametrize("family", ["vit", "swin"])
def test_lora_trains_only_adapters_and_head_and_saves_a_merged_model(family, tmp_path):
    model = _tiny(family)
    keras_vit.enable_lora(model, 2, targets=("attention", "mlp"))
    adapted = ("attention/qkv", "attention/proj", "fc1", "fc2")
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert trainable == _adapted_parameters(model, 2, adapted)

    before = {v.path: np.array(v) for v in model.weights}
    model.compile(keras.optimizers.AdamW(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype("float32")
    model.fit(images, np.arange(4), epochs=1, batch_size=4, verbose=0)  # one step
    moved = {v.path for v in model.weights if not np.array_equal(np.array(v), before[v.path])}
    assert moved and all("lora_kernel" in path or path.startswith("head/") for path in moved), moved
    assert any(path.endswith("lora_kernel_b") for path in moved) and "head/kernel" in moved

    unmerged = np.asarray(model(images))
    save_model(model, tmp_path / "merged.keras")
    merged = keras.models.load_model(tmp_path / "merged.keras")
    assert not any("lora" in v.path for v in merged.weights)
    np.testing.assert_allclose(np.asarray(merged(images)), unmerged, atol=1e-5)


def test_lora_on_vit_b16_trains_half_a_percent_of_it():
    """ViT-B/16 at rank 8 on QKV and the attention output, with a 10-class head: 450,058 of its
    parameters train (the README's figure)."""
    model = keras_vit.create_model("vit_base_patch16_224", num_classes=10)
    keras_vit.enable_lora(model, 8)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert trainable == _adapted_parameters(model, 8, ("attention/qkv", "attention/proj")) == 450_058


def test_lora_refuses_what_it_cannot_adapt_in_one_line():
    model = _tiny("vit")
    with pytest.raises(ValueError, match="Unknown LoRA target norm for a vit model; targets: attention, mlp"):
        keras_vit.enable_lora(model, 2, targets=("norm",))
    with pytest.raises(ValueError, match="at least 1"):
        keras_vit.enable_lora(model, 0)
    keras_vit.enable_lora(model, 2)
    with pytest.raises(ValueError, match="already enabled"):
        keras_vit.enable_lora(model, 2)


# A LoRA run on JAX killed, resumed exactly, evaluated and exported under TensorFlow: in
# test_jax_backend.py, with the JAX backend's own run.


@pytest.mark.parametrize(
    "attention, targets, adapted",
    [
        ("standard", ("attention",), ("in_proj", "attn_out_proj")),
        ("standard", ("mlp",), ("in_proj", "mlp_out_proj")),
        ("standard", ("attention", "mlp"), ("in_proj", "attn_out_proj", "mlp_out_proj")),
        ("diff", ("attention", "mlp"), ("in_proj", "out_proj")),  # one fused output projection
    ],
)
def test_lora_adapts_a_parallel_blocks_fused_projections(attention, targets, adapted):
    """timm's ParallelScalingBlock has no qkv/proj/fc1/fc2: its fused in_proj (QKV and the MLP's
    hidden units) and its output projections are what LoRA adapts, each once."""
    model = keras_vit.ViT(
        image_size=32, patch_size=8, hidden_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10,
        block="parallel", attention=attention,
    )  # fmt: skip
    keras_vit.enable_lora(model, 2, targets=targets)
    enabled = sorted(layer.path for layer in model._flatten_layers() if getattr(layer, "lora_enabled", False))
    assert enabled == sorted(f"block_{i}/{name}" for i in range(2) for name in adapted)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert trainable == _adapted_parameters(model, 2, adapted)
    images = np.random.default_rng(1).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    before = np.asarray(model(images))
    for layer in model._flatten_layers():
        if getattr(layer, "lora_enabled", False):
            layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.1, "float32"))
    assert np.abs(np.asarray(model(images)) - before).max() > 1e-3  # the adapters are in the graph


@pytest.mark.parametrize(
    "mlp, adapted",
    [
        ("swiglu", ("attention/qkv", "attention/proj", "fc1_g", "fc1_x", "fc2")),  # AIMv2
        ("swiglu_packed", ("attention/qkv", "attention/proj", "fc1", "fc2")),  # DINOv2-g: fc1 holds both
    ],
)
def test_lora_on_the_mlp_adapts_a_swiglus_gate_and_value(mlp, adapted):
    """`--lora-targets mlp` on a SwiGLU MLP adapts its gate and its value (`fc1_g`, `fc1_x`), as
    it adapts fc1 of a plain MLP: leaving them out would train a third of the MLP it names."""
    model = keras_vit.ViT(
        image_size=32, patch_size=8, hidden_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10, mlp=mlp
    )
    keras_vit.enable_lora(model, 2, targets=("attention", "mlp"))
    enabled = sorted(layer.path for layer in model._flatten_layers() if getattr(layer, "lora_enabled", False))
    assert enabled == sorted(f"block_{i}/{name}" for i in range(2) for name in adapted)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert trainable == _adapted_parameters(model, 2, adapted)


# One architecture of each kind of block the families build: plain, CLIP, MAP head, registers,
# SwiGLU (packed and not), post-norm, relative position bias, parallel and differential
# attention, hybrid stems, AIMv2's RMSNorms; the Eva's rotary kinds (fused and separate QKV).
EVERY_BLOCK_KIND = [
    "vit_small_patch16_224", "vit_base_patch16_clip_224", "vit_base_patch16_siglip_224",
    "vit_small_patch14_reg4_dinov2", "vit_giant_patch14_dinov2", "aimv2_large_patch14_224",
    "vit_base_patch16_rpn_224", "vit_relpos_small_patch16_224", "vit_pwee_patch16_reg1_gap_256",
    "vit_dwee_patch16_reg1_gap_256", "vit_dpwee_patch16_reg1_gap_256", "vit_small_r26_s32_224",
    "beit3_base_patch16_224", "vit_small_patch16_dinov3", "eva02_tiny_patch14_224",
    "vit_pe_core_small_patch16_384", "swin_tiny_patch4_window7_224",
]  # fmt: skip
# Two blocks each (a Swin: one per stage, two in the third).
FEW_BLOCKS = {"swin_tiny_patch4_window7_224": dict(depths=(1, 1, 2, 1))}


@pytest.mark.parametrize("name", EVERY_BLOCK_KIND)
def test_lora_model_parallel_and_remat_reach_every_projection_of_every_block(name):
    """`--lora-targets attention,mlp` adapts, and `--strategy model-parallel` shards, every Dense
    layer of every block (but a relative position bias' own small MLP), and `--remat` recomputes
    every block: a kind whose layers carry other names would train, shard or recompute only a
    part of itself, silently."""
    family = registry.family_named(name)
    model = keras_vit.create_model(name, num_classes=3, **FEW_BLOCKS.get(name, dict(depth=2)))
    blocks = [model.get_layer(block) for block in family.block_names(model.get_config())]
    assert len(blocks) == sum(hasattr(layer, "rematerialise") for layer in model._flatten_layers()) >= 2
    dense = {
        layer.path
        for block in blocks
        for layer in block._flatten_layers()
        if isinstance(layer, keras.layers.Dense) and "/rel_pos/" not in layer.path
    }
    assert {layer.path for layer in lora_layers(model, ("attention", "mlp"))} == dense
    kernels = [
        w.path for w in model.weights if w.path.rsplit("/", 1)[0] in dense and w.path.endswith("kernel")
    ]
    unsharded = [
        path for path in kernels if not any(re.search(p, path) for p in family.model_parallel_layout)
    ]
    assert len(kernels) >= 2 * len(blocks) and not unsharded
