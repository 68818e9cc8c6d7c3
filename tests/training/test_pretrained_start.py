"""`keras-vit train --weights NAME`: fine-tuning starts from a pretrained model by name, taking
its architecture, image size and normalisation, with a new head for the dataset's classes."""

import json

import numpy as np
import pytest
import timm
import torch
from conftest import HUB
from timm.models import save_for_hf

from keras_vit.cli import main
from keras_vit.storage.saving import load_trained_model


def _two_frozen_steps(dataset, weights, output):
    """`keras-vit train` arguments: two steps from `weights` with the backbone frozen."""
    return [
        "train", "--dataset", dataset, "--weights", weights, "--output", str(output), "--epochs", "1",
        "--steps-per-epoch", "2", "--batch-size", "8", "--validation-split", "0.25", "--freeze-backbone",
        "--no-jit-compile",
    ]  # fmt: skip


def test_train_from_a_pretrained_name_takes_its_architecture_and_weights_with_a_new_head(
    colors_dataset, hub_cache, tmp_path
):
    torch.manual_seed(0)
    reference = timm.create_model(
        "vit_small_patch16_224", pretrained=False, num_classes=5, img_size=32, patch_size=4, embed_dim=32,
        depth=2, num_heads=4, mlp_ratio=2.0,
    )  # fmt: skip
    reference.pretrained_cfg = dict(
        reference.pretrained_cfg, mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.4), license="cc-by-nc-4.0"
    )
    save_for_hf(reference, HUB.repo_folder("tests/small-to-tune"), safe_serialization=True)
    output = tmp_path / "run"
    assert main(_two_frozen_steps(colors_dataset, "hf-hub:tests/small-to-tune", output)) == 0
    model = load_trained_model(output)
    assert model.name == "vit_small_patch16_224" and model.image_size == (32, 32)
    assert (model.hidden_dim, model.depth, model.num_classes) == (32, 2, 3)
    assert model.image_mean == [0.4, 0.5, 0.6] and model.image_std == [0.2, 0.3, 0.4]
    assert model.license == "cc-by-nc-4.0"  # the weights' licence, which the exports carry
    # The frozen backbone is the pretrained one, weight for weight.
    state = reference.state_dict()
    qkv = {w.path: np.asarray(w) for w in model.weights}["block_1/attention/qkv/kernel"]
    np.testing.assert_allclose(qkv, state["blocks.1.attn.qkv.weight"].numpy().T, atol=1e-6)
    recorded = json.loads((output / "preprocessing.json").read_text())
    assert recorded["image_mean"] == [0.4, 0.5, 0.6]
    # No --preset: pretrained weights take fine-tuning's settings, not scratch's steps of 1e-3.
    settings = json.loads((output / "history.json").read_text())["config"]
    assert settings["preset"] == "finetune" and settings["learning_rate"] == 1e-4


def test_train_with_a_name_that_is_no_model_is_one_line(colors_dataset, hub_cache, tmp_path, capsys):
    argv = ["train", "--dataset", colors_dataset, "--weights", "vit_smal_patch16_224"]
    assert main([*argv, "--output", str(tmp_path / "run")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "did you mean vit_small_patch16_224" in line, line
    assert not (tmp_path / "run").exists()


def test_train_from_a_transformers_repo_builds_the_nearest_architecture_with_its_weights(
    colors_dataset, hub_cache, tmp_path
):
    """A transformers repo names no timm architecture: the run builds the nearest named one and
    overrides where the repo differs (width, depth, LayerNorm epsilon), with its weights."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        image_size=32, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, id2label=dict(enumerate(["cat", "dog", "fox", "owl"])),
    )  # fmt: skip
    torch.manual_seed(4)
    reference = transformers.ViTForImageClassification(config)
    reference.save_pretrained(HUB.repo_folder("tests/transformers-to-tune"))
    output = tmp_path / "run"
    assert main(_two_frozen_steps(colors_dataset, "hf-hub:tests/transformers-to-tune", output)) == 0
    model = load_trained_model(output)
    assert model.name == "vit_nano_patch4_32" and model.image_size == (32, 32)  # patch 4 at 32 px
    assert (model.hidden_dim, model.depth, model.mlp_dim, model.num_classes) == (32, 2, 64, 3)
    assert model.layer_norm_epsilon == 1e-12 and model.image_mean == [0.5, 0.5, 0.5]
    state = reference.state_dict()
    kernel = {w.path: np.asarray(w) for w in model.weights}["block_1/attention/qkv/kernel"]
    names = ("layers.1.attention.q_proj.weight", "layer.1.attention.attention.query.weight")  # 5.x, 4.x
    query = next(value for key, value in state.items() if key.endswith(names)).numpy()
    np.testing.assert_allclose(kernel[:, :32], query.T, atol=1e-6)  # the frozen backbone is the repo's


def test_freeze_blocks_trains_the_later_blocks_and_keeps_the_stem_and_first_ones(
    colors_dataset, hub_cache, tmp_path, capsys
):
    """Partial fine-tuning: `--freeze-blocks 1` of a 2-block ViT keeps the patch embedding (its
    class token and position embeddings too) and block 0 as loaded, and trains block 1 and the head;
    freezing every block is refused in one line, before a run folder is written."""
    torch.manual_seed(1)
    reference = timm.create_model(
        "vit_small_patch16_224", pretrained=False, num_classes=5, img_size=32, patch_size=4, embed_dim=32,
        depth=2, num_heads=4, mlp_ratio=2.0,
    )  # fmt: skip
    save_for_hf(reference, HUB.repo_folder("tests/partly-frozen"), safe_serialization=True)
    argv = _two_frozen_steps(colors_dataset, "hf-hub:tests/partly-frozen", tmp_path / "run")
    argv = [*argv[:-2], "--learning-rate", "1e-2", "--freeze-blocks", "1", "--no-jit-compile"]
    assert main(argv) == 0
    weights = {w.path: np.asarray(w) for w in load_trained_model(tmp_path / "run").weights}
    state = {key: value.numpy() for key, value in reference.state_dict().items()}
    np.testing.assert_array_equal(
        weights["block_0/attention/qkv/kernel"], state["blocks.0.attn.qkv.weight"].T
    )
    np.testing.assert_array_equal(weights["block_0/fc2/kernel"], state["blocks.0.mlp.fc2.weight"].T)
    frozen_stem = [path for path in weights if path.startswith("patch_encoder/")]
    assert frozen_stem and all("cls" in p or "pos" in p or "projection" in p for p in frozen_stem), (
        frozen_stem
    )
    np.testing.assert_array_equal(
        weights["patch_encoder/projection/kernel"], state["patch_embed.proj.weight"].transpose(2, 3, 1, 0)
    )
    for ours, timms in (
        ("block_1/attention/qkv/kernel", "blocks.1.attn.qkv.weight"),
        ("block_1/fc2/kernel", "blocks.1.mlp.fc2.weight"),
    ):
        assert not np.allclose(weights[ours], state[timms].T), ours

    capsys.readouterr()
    argv = _two_frozen_steps(colors_dataset, "hf-hub:tests/partly-frozen", tmp_path / "all-frozen")
    argv = [*argv[:-2], "--freeze-blocks", "2"]
    assert main(argv) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--freeze-blocks 2 leaves no block to train" in line and "--freeze-backbone" in line, line
    assert not (tmp_path / "all-frozen").exists()
