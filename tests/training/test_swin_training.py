"""Training a Swin: layer decay and weight decay as timm groups them (and the ViT's, beside it),
`keras-vit train --model` on a Swin (teaching a distilled ViT), and the JAX backend. Tiny configs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import timm
import timm.optim
import torch
from conftest import HANG_SECONDS

import keras_vit
from keras_vit.cli import main
from keras_vit.model import registry
from keras_vit.storage.saving import load_trained_model
from keras_vit.training.optimizers import layer_decay_multipliers

TINY = dict(embed_dim=16, depths=(2, 2, 2, 1), num_heads=(1, 2, 2, 4))
# Two stages for the runs that compile (at 32 px with windows of 4: a shifted block, a patch merging).
TINY_FLAGS = [
    "--model=swin_tiny_patch4_window7_224",
    "--override=embed_dim=16",
    "--override=depths=[2,1]",
    "--override=num_heads=[1,2]",
    "--override=window_size=4",
]
# At 64 px with windows of 4: both stages shifted, with their masks.
TWO_STAGES = dict(embed_dim=16, depths=(2, 2), num_heads=(1, 2))


def _timm_key_of_each_variable(model):
    """{Keras variable path: timm key}, from the Swin's checkpoint mapping."""
    checkpoint = registry.family_of(model).checkpoint()
    pairs = checkpoint.targets(model) + [
        target for prefix, layer in checkpoint.optional_layers(model) for target in _linear(layer, prefix)
    ]
    return {variable.path: key for key, variable, _ in pairs}


def _linear(layer, prefix):
    from keras_vit.model.state import linear

    return linear(layer, prefix)


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("swin_tiny_patch4_window7_224", TINY),
        ("vit_tiny_patch16_224", dict(embed_dim=32, depth=2, num_heads=2, img_size=32)),
        # The timm kinds' new weights: relative position biases (a shared one in no group, at the
        # full rate, as timm's group_matcher leaves it), a hybrid's ResNetV2 (the patch embedding's
        # group), parallel blocks and differential attention (lambdas without decay).
        ("vit_relpos_base_patch16_clsgap_224", dict(embed_dim=32, depth=2, num_heads=2, img_size=32)),
        ("vit_srelpos_small_patch16_224", dict(embed_dim=32, depth=2, num_heads=2, img_size=32)),
        ("vit_small_r26_s32_224", dict(embed_dim=32, depth=2, num_heads=2, img_size=32)),
        ("vit_dpwee_patch16_reg1_gap_256", dict(embed_dim=32, depth=2, num_heads=2, img_size=32)),
        ("vit_dwee_patch16_reg1_gap_256", dict(embed_dim=32, depth=2, num_heads=2, img_size=32)),
        # SigLIP's attention-pooling head (its probe and MLP: the head's full rate), DINOv2's
        # register tokens, CLIP's norm before the blocks.
        ("vit_base_patch16_siglip_224", dict(embed_dim=32, depth=2, num_heads=2, img_size=32)),
        ("vit_small_patch14_reg4_dinov2", dict(embed_dim=32, depth=2, num_heads=2, img_size=28)),
        ("vit_base_patch32_clip_224", dict(embed_dim=32, depth=2, num_heads=2, img_size=32)),
    ],
)
def test_layer_decay_and_weight_decay_group_the_weights_as_timm_does(name, arguments):
    """timm's `param_groups_layer_decay` (its group_matcher, no_weight_decay and 1-d rule, called
    as its create_optimizer_v2 does) gives each weight a learning-rate scale and a weight decay;
    keras-vit's AdamW gives the same, for each family."""
    reference = timm.create_model(name, num_classes=3, **arguments)
    groups = timm.optim.param_groups_layer_decay(
        reference, weight_decay=0.05, layer_decay=0.5, no_weight_decay_list=reference.no_weight_decay()
    )
    names = {id(p): n for n, p in reference.named_parameters()}
    timm_scale = {names[id(p)]: group["lr_scale"] for group in groups for p in group["params"]}
    timm_decays = {names[id(p)]: group["weight_decay"] > 0 for group in groups for p in group["params"]}
    vit = dict(hidden_dim=32, depth=2, num_heads=2, mlp_dim=128, image_size=arguments.get("img_size"))  # ours
    model = keras_vit.create_model(name, num_classes=3, **(vit if name.startswith("vit") else arguments))
    multipliers = layer_decay_multipliers(model, 0.5)
    optimizer = keras_vit.optimizers.AdamW(learning_rate=1e-3, weight_decay=0.05, lr_multipliers=multipliers)
    optimizer.exclude_from_weight_decay(var_names=list(registry.family_of(model).no_weight_decay))
    keys = _timm_key_of_each_variable(model)
    assert len(keys) == len(model.trainable_variables) == len(timm_scale)
    for variable in model.trainable_variables:
        key = keys[variable.path]
        scale = multipliers.get(variable.path.split("/", 1)[0], 1.0)
        assert scale == pytest.approx(timm_scale[key]), (variable.path, key)
        assert optimizer._use_weight_decay(variable) == timm_decays[key], (variable.path, key)


def test_train_builds_a_swin_by_name_in_bfloat16_and_it_teaches_a_distilled_vit(tmp_path, colors_dataset):
    run = tmp_path / "swin"
    common = ["--dataset", colors_dataset, "--image-size", "32", "--batch-size", "8", "--epochs", "1"]
    bfloat16 = ["--precision", "mixed_bfloat16"]
    trained = [
        "train",
        *TINY_FLAGS,
        *common,
        "--layer-decay",
        "0.75",
        "--ema",
        "0.9",
        *bfloat16,
        "--output",
        str(run),
    ]
    assert main(trained) == 0
    swin = load_trained_model(str(run))
    assert swin.family == "swin" and swin.depths == (2, 1)
    summary = json.load(open(run / "history.json"))
    assert summary["config"]["precision"] == "mixed_bfloat16" and np.isfinite(summary["final"]["loss"])
    # The Swin teaches a distilled DeiT (DeiT's hard distillation through the second token).
    student = tmp_path / "student"
    tiny_deit = [
        "--override=depth=1",
        "--override=hidden_dim=32",
        "--override=num_heads=2",
        "--override=mlp_dim=64",
    ]
    deit = ["--model", "deit_tiny_distilled_patch16_224", *tiny_deit, "--override=patch_size=8"]
    assert (
        main(["train", *deit, *common, "--teacher", str(run / "model.keras"), "--output", str(student)]) == 0
    )
    assert load_trained_model(str(student)).distillation_token


@pytest.mark.skipif(not __import__("importlib").util.find_spec("jax"), reason="needs JAX")
def test_a_swin_gives_timms_logits_and_trains_a_step_on_jax(tmp_path):
    """Keras reads the backend once per process: a JAX process, on a timm Swin's weights."""
    reference = timm.create_model(
        "swin_tiny_patch4_window7_224", num_classes=3, img_size=64, window_size=4, **TWO_STAGES
    )
    from safetensors.torch import save_file

    save_file(
        {k: v.contiguous() for k, v in reference.state_dict().items()}, str(tmp_path / "swin.safetensors")
    )
    x = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype("float32")
    with torch.no_grad():
        expected = reference.eval()(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()
    np.save(tmp_path / "x.npy", x)
    script = f"""
import json, numpy as np, keras, keras_vit
model = keras_vit.create_model("swin_tiny_patch4_window7_224", num_classes=3, image_size=64, window_size=4,
                               **{TWO_STAGES!r})
keras_vit.load_weights(model, {str(tmp_path / "swin.safetensors")!r})
x = np.load({str(tmp_path / "x.npy")!r})
logits = np.asarray(model(x))
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
loss = model.train_on_batch(x, np.array([0, 2]))
print(json.dumps({{"backend": keras.backend.backend(), "logits": logits.tolist(), "loss": float(loss)}}))
"""
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=HANG_SECONDS
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["backend"] == "jax" and np.isfinite(result["loss"])
    assert np.abs(np.array(result["logits"]) - expected).max() < 1e-4
