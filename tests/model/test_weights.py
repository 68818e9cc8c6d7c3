"""Weight import, verified against timm (code we did not write) on random weights.

Nothing is downloaded: each test builds a timm model with pretrained=False,
saves it in a checkpoint format, and compares both models' logits.
"""

import logging

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

import keras_vit
from keras_vit import CheckpointMismatchError

timm = pytest.importorskip("timm")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from timm.layers import resample_abs_pos_embed  # noqa: E402
from timm.models.vision_transformer import (  # noqa: E402
    VisionTransformer,
    _load_weights,
    checkpoint_filter_fn,
)

PARITY_TOLERANCE = 1e-4  # float32, max absolute difference of logits


def _timm_model(name, seed=0, **kwargs):
    torch.manual_seed(seed)
    return timm.create_model(name, pretrained=False, **kwargs).eval()


def _timm_logits(model, images):
    with torch.no_grad():
        return model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()


def _images(size, batch=2, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, size, size, 3)).astype("float32")


def _save_safetensors(model, path):
    safetensors_torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def _save_npz(model, path):
    """Writes a timm ViT in the original google-research/vision_transformer layout."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    dim = sd["cls_token"].shape[-1]
    heads = model.blocks[0].attn.num_heads
    w = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": sd["patch_embed.proj.bias"],
        "cls": sd["cls_token"],
        "Transformer/posembed_input/pos_embedding": sd["pos_embed"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
        "head/kernel": sd["head.weight"].T,
        "head/bias": sd["head.bias"],
    }
    for i in range(len(model.blocks)):
        src, dst = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        mha = dst + "MultiHeadDotProductAttention_1/"
        for n, q in zip(("query", "key", "value"), np.split(sd[src + "attn.qkv.weight"], 3), strict=True):
            w[f"{mha}{n}/kernel"] = q.T.reshape(dim, heads, dim // heads)
        for n, b in zip(("query", "key", "value"), np.split(sd[src + "attn.qkv.bias"], 3), strict=True):
            w[f"{mha}{n}/bias"] = b.reshape(heads, dim // heads)
        w[f"{mha}out/kernel"] = sd[src + "attn.proj.weight"].T.reshape(heads, dim // heads, dim)
        w[f"{mha}out/bias"] = sd[src + "attn.proj.bias"]
        for ln, name in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            w[f"{dst}{ln}/scale"] = sd[f"{src}{name}.weight"]
            w[f"{dst}{ln}/bias"] = sd[f"{src}{name}.bias"]
        for r in range(2):
            w[f"{dst}MlpBlock_3/Dense_{r}/kernel"] = sd[f"{src}mlp.fc{r + 1}.weight"].T
            w[f"{dst}MlpBlock_3/Dense_{r}/bias"] = sd[f"{src}mlp.fc{r + 1}.bias"]
    np.savez(path, **w)
    return path


def _max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


PARITY_NAMES = ["vit_tiny_patch16_224", "vit_small_patch32_224", "vit_base_patch16_224"]


@pytest.mark.parametrize("name", PARITY_NAMES)
def test_safetensors_from_timm_give_timms_logits(name, tmp_path, record_parity):
    reference = _timm_model(name)
    model = keras_vit.load_weights(
        keras_vit.create_model(name), _save_safetensors(reference, tmp_path / "model.safetensors")
    )
    images = _images(224)
    expected = _timm_logits(reference, images)
    assert np.abs(expected).max() > 0.1  # a real signal, not zeros on both sides
    difference = _max_diff(model(images), expected)
    assert (
        record_parity(f"{name} .safetensors vs timm, logits", difference, PARITY_TOLERANCE)
        <= PARITY_TOLERANCE
    )


# The Google layout's mapping does not depend on size: its per-head reshapes are checked at 3 and 6
# heads (a ViT-B/16 doubled this test's time).
@pytest.mark.parametrize("name", PARITY_NAMES[:2])
def test_npz_read_by_timms_own_loader_and_ours_give_the_same_logits(name, tmp_path, record_parity):
    path = _save_npz(_timm_model(name, seed=1), tmp_path / "model.npz")
    reference = _timm_model(name, seed=2)
    _load_weights(reference, str(path))  # timm's reader of the Google format
    model = keras_vit.load_weights(keras_vit.create_model(name), path)
    images = _images(224, seed=1)
    difference = _max_diff(model(images), _timm_logits(reference, images))
    assert (
        record_parity(f"{name} .npz vs timm's _load_weights, logits", difference, PARITY_TOLERANCE)
        <= PARITY_TOLERANCE
    )


def test_pth_training_checkpoint_with_a_model_wrapper(tmp_path):
    reference = _timm_model("vit_tiny_patch16_224", seed=3)
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": reference.state_dict(), "epoch": 3}, path)
    model = keras_vit.load_weights(keras_vit.create_model("vit_tiny_patch16_224"), path)
    images = _images(224, seed=2)
    assert _max_diff(model(images), _timm_logits(reference, images)) <= PARITY_TOLERANCE


def test_resized_position_embeddings_match_timms_resampling(tmp_path, record_parity):
    """A 224 checkpoint loaded at 384: timm's checkpoint_filter_fn against our loader.

    Both resample with antialiased bicubic interpolation (ours in float64 NumPy,
    timm's in float32 PyTorch), so the embeddings agree to float32 rounding
    (about 1e-7 here) and the logits to the same 1e-4 as the plain parity tests.
    """
    source = _timm_model("vit_tiny_patch16_224", seed=4)
    reference = _timm_model("vit_tiny_patch16_384", seed=5)
    reference.load_state_dict(checkpoint_filter_fn(source.state_dict(), reference))
    model = keras_vit.load_weights(
        keras_vit.create_model("vit_tiny_patch16_384"), _save_safetensors(source, tmp_path / "m.safetensors")
    )
    ours = to_numpy(model.get_layer("patch_encoder").position_embedding)
    assert ours.shape == (1, 1 + 24 * 24, 192)
    difference = _max_diff(ours, reference.pos_embed.detach().numpy())
    assert record_parity("vit_tiny 224 -> 384 position embeddings vs timm", difference, 1e-6) <= 1e-6
    images = _images(384, seed=3)
    difference = _max_diff(model(images), _timm_logits(reference, images))
    assert (
        record_parity("vit_tiny 224 -> 384 logits vs timm", difference, PARITY_TOLERANCE) <= PARITY_TOLERANCE
    )


def test_a_distilled_deit_gives_timms_logits_and_each_heads(tmp_path, record_parity):
    from keras_vit.model.vit import distilled_heads

    reference = _timm_model("deit_tiny_distilled_patch16_224")
    path = _save_safetensors(reference, tmp_path / "distilled.safetensors")
    model = keras_vit.load_weights(keras_vit.create_model("deit_tiny_distilled_patch16_224"), path)
    images = _images(224)
    difference = _max_diff(model(images), _timm_logits(reference, images))  # timm: both heads' mean
    name = "deit_tiny_distilled_patch16_224 .safetensors vs timm, logits"
    assert record_parity(name, difference, PARITY_TOLERANCE) <= PARITY_TOLERANCE
    heads = distilled_heads(model)(images)
    with torch.no_grad():
        tokens = reference.forward_features(torch.from_numpy(images).permute(0, 3, 1, 2))
        expected = {"head": reference.head(tokens[:, 0]), "head_dist": reference.head_dist(tokens[:, 1])}
    for head in ("head", "head_dist"):
        assert _max_diff(heads[head], expected[head].numpy()) <= PARITY_TOLERANCE


@pytest.mark.parametrize(
    "name, size",
    [
        ("vit_base_patch16_gap_224", 64),  # no [cls]: LayerNorm, then the patch mean (2 blocks)
        ("vit_medium_patch16_reg4_gap_256", 64),  # registers, LayerScale, patch mean, fc_norm
        ("vit_small_patch14_reg4_dinov2", 56),  # [cls] and registers, LayerScale
    ],
)
def test_register_and_gap_checkpoints_give_timms_logits(name, size, tmp_path, record_parity):
    """Each layout at a small image size (a few tokens keep the suite fast on 2 cores); the
    ViT-B with 2 of its 12 blocks."""
    depth = {"depth": 2} if name == "vit_base_patch16_gap_224" else {}
    reference = _timm_model(name, num_classes=10, img_size=size, **depth)
    with torch.no_grad():  # trained-like LayerScale, where the model has it
        for block in reference.blocks:
            for scale in (block.ls1, block.ls2):
                if hasattr(scale, "gamma"):
                    scale.gamma.uniform_(0.5, 1.5)
    path = _save_safetensors(reference, tmp_path / "model.safetensors")
    model = keras_vit.load_weights(
        keras_vit.create_model(name, num_classes=10, image_size=size, **depth), path
    )
    images = _images(size, batch=1)
    expected = _timm_logits(reference, images)
    assert np.abs(expected).max() > 0.1
    difference = _max_diff(model(images), expected)
    assert (
        record_parity(f"{name} .safetensors vs timm, logits", difference, PARITY_TOLERANCE)
        <= PARITY_TOLERANCE
    )


def test_layer_scale_and_patch_only_position_embeddings_match_timm_also_resized(
    tmp_path, tiny_config, images
):
    """DeiT III's layout (timm's init_values and no_embed_class) at the suite's size, then at 48x48."""
    reference = _small_timm(no_embed_class=True, init_values=0.1)
    model = keras_vit.ViT(**tiny_config, layer_scale=0.1, cls_position_embedding=False)
    keras_vit.load_weights(model, _save_safetensors(reference, tmp_path / "deit3.safetensors"))
    assert _max_diff(model(images), _timm_logits(reference, images)) <= PARITY_TOLERANCE
    resized = keras_vit.resize_model(model, image_size=48)
    expected = resample_abs_pos_embed(reference.pos_embed.detach(), new_size=(12, 12), num_prefix_tokens=0)
    ours = to_numpy(resized.get_layer("patch_encoder").position_embedding)
    assert ours.shape == (1, 144, 32) and _max_diff(ours, expected.numpy()) <= 1e-5


@pytest.mark.parametrize("old,new", [((14, 14), (7, 10)), ((4, 4), (12, 12)), ((6, 9), (5, 5))])
def test_resampling_matches_timm_when_shrinking_and_on_non_square_grids(old, new):
    pos = np.random.default_rng(0).normal(size=(1, 1 + old[0] * old[1], 8)).astype("float32")
    expected = resample_abs_pos_embed(torch.from_numpy(pos), new_size=new, old_size=old).numpy()
    ours = keras_vit.resample_position_embeddings(pos, new, old)
    assert ours.shape == expected.shape
    assert _max_diff(ours, expected) <= 1e-5
    np.testing.assert_array_equal(ours[:, 0], pos[:, 0])


def _small_timm(**kwargs):
    torch.manual_seed(6)
    args = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2, num_classes=10)
    args.update(kwargs)
    return VisionTransformer(**args).eval()


def test_gap_pooling_matches_timms_avg_pool_with_fc_norm(tmp_path, tiny_config, images):
    reference = _small_timm(global_pool="avg")
    assert "fc_norm.weight" in reference.state_dict()
    model = keras_vit.ViT(**tiny_config, pooling="gap")
    keras_vit.load_weights(model, _save_safetensors(reference, tmp_path / "gap.safetensors"))
    assert _max_diff(model(images), _timm_logits(reference, images)) <= PARITY_TOLERANCE


def test_a_new_class_count_keeps_the_backbone_and_reinitialises_the_head(
    tmp_path, tiny_config, images, caplog
):
    reference = _small_timm(num_classes=1000)
    path = _save_safetensors(reference, tmp_path / "in1k.safetensors")
    model = keras_vit.ViT(**tiny_config)  # 10 classes
    head_before = to_numpy(model.get_layer("head").kernel).copy()
    with caplog.at_level(logging.WARNING, logger="keras_vit.model.weights"):
        keras_vit.load_weights(model, path)
    assert "head layer re-initialised: the model has 10 outputs; the checkpoint's has 1000." in caplog.text
    np.testing.assert_array_equal(to_numpy(model.get_layer("head").kernel), head_before)

    features = keras_vit.ViT(**tiny_config, include_top=False)
    keras_vit.load_weights(features, path)
    with torch.no_grad():
        x = torch.from_numpy(images).permute(0, 3, 1, 2)
        expected = reference.forward_head(reference.forward_features(x), pre_logits=True).numpy()
    assert _max_diff(features(images), expected) <= PARITY_TOLERANCE


def test_grayscale_model_sums_the_rgb_filters(tmp_path, tiny_config):
    reference = _small_timm()
    model = keras_vit.ViT(**dict(tiny_config, channels=1))
    keras_vit.load_weights(model, _save_safetensors(reference, tmp_path / "rgb.safetensors"))
    rgb = reference.patch_embed.proj.weight.detach().numpy()
    expected = rgb.sum(axis=1, keepdims=True).transpose(2, 3, 1, 0)
    np.testing.assert_allclose(
        to_numpy(model.get_layer("patch_encoder").projection.kernel), expected, atol=1e-6
    )


def test_a_checkpoint_of_another_width_names_the_key_and_both_shapes(tmp_path, tiny_config):
    path = _save_safetensors(_small_timm(embed_dim=48, num_heads=4), tmp_path / "wide.safetensors")
    model = keras_vit.ViT(**tiny_config)
    before = [to_numpy(w).copy() for w in model.weights]
    with pytest.raises(
        CheckpointMismatchError, match=r"'patch_embed.proj.weight' has shape \(48, 3, 4, 4\).*\(4, 4, 3, 32\)"
    ):
        keras_vit.load_weights(model, path)
    # Nothing was assigned: a failed load leaves the model as it was.
    for old, new in zip(before, model.weights, strict=True):
        np.testing.assert_array_equal(old, to_numpy(new))


def test_missing_and_extra_keys_are_named(tmp_path, tiny_config):
    state = {k: v.contiguous() for k, v in _small_timm().state_dict().items()}
    missing = dict(state)
    del missing["blocks.1.mlp.fc2.bias"]
    safetensors_torch.save_file(missing, str(tmp_path / "missing.safetensors"))
    with pytest.raises(CheckpointMismatchError, match=r"lacks 1 key\(s\).*blocks\.1\.mlp\.fc2\.bias"):
        keras_vit.load_weights(keras_vit.ViT(**tiny_config), tmp_path / "missing.safetensors")

    deeper = {k: v.contiguous() for k, v in _small_timm(depth=3).state_dict().items()}
    safetensors_torch.save_file(deeper, str(tmp_path / "deeper.safetensors"))
    with pytest.raises(CheckpointMismatchError, match=r"no place for.*blocks\.2\."):
        keras_vit.load_weights(keras_vit.ViT(**tiny_config), tmp_path / "deeper.safetensors")


def test_bad_paths_and_files_get_clear_errors(tmp_path, tiny_config):
    model = keras_vit.ViT(**tiny_config)
    with pytest.raises(FileNotFoundError, match="Checkpoint not found: .*nope.safetensors"):
        keras_vit.load_weights(model, tmp_path / "nope.safetensors")
    (tmp_path / "weights.h5").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"Unknown checkpoint format '\.h5'"):
        keras_vit.load_weights(model, tmp_path / "weights.h5")
    (tmp_path / "broken.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(
        ValueError, match=r"Could not read .*broken.safetensors as a \.safetensors checkpoint"
    ):
        keras_vit.load_weights(model, tmp_path / "broken.safetensors")
    np.savez(tmp_path / "other.npz", **{"params/img/embedding/kernel": np.zeros(1)})
    with pytest.raises(CheckpointMismatchError, match="big_vision checkpoint, which is not supported"):
        keras_vit.load_weights(model, tmp_path / "other.npz")
    with pytest.raises(TypeError, match="needs a keras-vit model"):
        keras_vit.load_weights(
            keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]), tmp_path / "other.npz"
        )


@pytest.mark.parametrize("pooler", [False, True])
def test_hugging_face_transformers_checkpoints_give_transformers_logits(
    tmp_path, tiny_config, images, pooler, record_parity
):
    """`save_pretrained` writes the hub's key names (google/vit-base-patch16-224 and kin)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(  # the tiny ViT in transformers' names
        image_size=tiny_config["image_size"],
        patch_size=tiny_config["patch_size"],
        hidden_size=tiny_config["hidden_dim"],
        num_hidden_layers=tiny_config["depth"],
        num_attention_heads=tiny_config["num_heads"],
        intermediate_size=tiny_config["mlp_dim"],
        num_labels=tiny_config["num_classes"],
        layer_norm_eps=1e-12,
    )
    torch.manual_seed(7)
    if pooler:  # ViTModel's pooler (Dense + tanh on [cls]) is the paper's pre-logits layer
        reference = transformers.ViTModel(config, add_pooling_layer=True).eval()
        model = keras_vit.ViT(
            **dict(tiny_config, include_top=False), representation_size=32, layer_norm_epsilon=1e-12
        )
    else:
        reference = transformers.ViTForImageClassification(config).eval()
        model = keras_vit.ViT(**tiny_config, layer_norm_epsilon=1e-12)
    reference.save_pretrained(tmp_path)
    keras_vit.load_weights(model, tmp_path / "model.safetensors")
    with torch.no_grad():
        output = reference(pixel_values=torch.from_numpy(images).permute(0, 3, 1, 2))
    expected = (output.pooler_output if pooler else output.logits).numpy()
    case = f"tiny transformers {'ViTModel pooler' if pooler else 'ViTForImageClassification logits'}"
    assert record_parity(case, _max_diff(model(images), expected), PARITY_TOLERANCE) <= PARITY_TOLERANCE


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_safetensors_load_exactly(tmp_path, tiny_config, images, dtype):
    reference = _small_timm().to(dtype)
    path = _save_safetensors(reference, tmp_path / "half.safetensors")
    model = keras_vit.load_weights(keras_vit.ViT(**tiny_config), path)
    expected = reference.patch_embed.proj.weight.float().detach().numpy().transpose(2, 3, 1, 0)
    np.testing.assert_array_equal(to_numpy(model.get_layer("patch_encoder").projection.kernel), expected)
    with torch.no_grad():
        logits = reference.float()(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
    assert _max_diff(model(images), logits) <= PARITY_TOLERANCE


def test_state_dict_gives_back_timms_state_dict_exactly(tmp_path):
    """Keras -> timm: every key timm has, with its values, for a distilled DeiT (both heads)."""
    from keras_vit.model.weights import state_dict

    reference = _timm_model("deit_tiny_distilled_patch16_224", img_size=64)
    path = _save_safetensors(reference, tmp_path / "distilled.safetensors")
    model = keras_vit.load_weights(
        keras_vit.create_model("deit_tiny_distilled_patch16_224", image_size=64), path
    )
    expected = {k: v.numpy() for k, v in reference.state_dict().items()}
    state = state_dict(model)
    assert set(state) == set(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(state[key], value, err_msg=key)


def test_a_keras_trained_vit_saved_for_timm_loads_in_timm_with_our_logits(tmp_path, record_parity):
    """Keras -> timm as the README says: `save_state_dict`, and the safetensors package on
    `state_dict` (it copies raw memory, so transposed views would scramble silently)."""
    import safetensors.numpy

    from keras_vit.model.weights import save_state_dict, state_dict

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=64, num_classes=5)
    state = state_dict(model)
    assert all(value.flags.c_contiguous for value in state.values())
    images = _images(64)
    ours = to_numpy(model(images))
    writers = {
        "save_state_dict": lambda path: save_state_dict(model, path),
        "safetensors.numpy": lambda path: safetensors.numpy.save_file(state, str(path)),
    }
    for writer, write in writers.items():
        path = tmp_path / f"{writer}.safetensors"
        write(path)
        loaded = timm.create_model(
            "vit_tiny_patch16_224", img_size=64, num_classes=5, pretrained=True,
            pretrained_cfg_overlay={"file": str(path), "num_classes": 5},
        ).eval()  # fmt: skip
        difference = _max_diff(_timm_logits(loaded, images), ours)
        assert (
            record_parity(f"keras-vit -> timm ({writer}), logits", difference, PARITY_TOLERANCE)
            <= PARITY_TOLERANCE
        )
    with pytest.raises(ValueError, match=r"model.npz: a state dict is written as .safetensors"):
        save_state_dict(model, tmp_path / "model.npz")


def test_another_runs_model_starts_a_fine_tune_at_a_new_size_with_its_head_only_for_the_same_classes(
    tmp_path, caplog
):
    """`--weights run/model.keras`: the backbone carries over (position embeddings resampled to
    the new grid); the head only when the class names are the same."""
    tiny = dict(patch_size=4, hidden_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=3)
    source = keras_vit.ViT(**tiny, image_size=32, class_names=["cat", "dog", "frog"])
    source.save(tmp_path / "model.keras")
    for classes, head_loaded in ((["cat", "dog", "frog"], True), (["ant", "bee", "fly"], False)):
        model = keras_vit.ViT(**tiny, image_size=48, class_names=classes)
        head_before = to_numpy(model.get_layer("head").kernel).copy()
        with caplog.at_level(logging.INFO, logger="keras_vit"):
            keras_vit.load_weights(model, tmp_path)  # the run folder: its model.keras
        for layer in ("block_1", "norm"):
            for got, want in zip(
                model.get_layer(layer).weights, source.get_layer(layer).weights, strict=True
            ):
                np.testing.assert_array_equal(to_numpy(got), to_numpy(want))
        assert model.get_layer("patch_encoder").position_embedding.shape == (1, 145, 32)
        head = to_numpy(model.get_layer("head").kernel)
        expected = to_numpy(source.get_layer("head").kernel) if head_loaded else head_before
        np.testing.assert_array_equal(head, expected)
    assert (
        "head layer re-initialised: the model has 3 outputs; the checkpoint's has 3, trained on other classes"
        in (caplog.text)
    )
