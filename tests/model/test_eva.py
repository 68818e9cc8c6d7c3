"""The Eva family (timm's `eva` module) against timm itself: a tiny random instance of each kind,
built by timm from a real tag's entry point, written with `save_for_hf` and served by the
stand-in hub as `hf-hub:timm/<tag>` (conftest), loaded by timm and by keras-vit, outputs compared
at the tag's size and at another (rotary tables recomputed, absolute embeddings resampled)."""

import shutil

import keras
import numpy as np
import pytest
import timm
import torch
from conftest import HUB
from keras import ops
from timm.models import save_for_hf
from timm_reference import SMALL, largest_difference, on_meta, reference_kind
from timm_reference import pixels as _pixels

import keras_vit
from keras_vit.model.eva.layers import RotaryEmbedding

# Tiny (timm_reference.SMALL): 2 blocks of width 64, 2 heads (a head of 32: rotary pairs in 4 bands
# per axis).
# (kind, timm tag, model_args beyond SMALL, another image size). The parts each kind brings:
KINDS = [
    # EVA02: axial RoPE (interleaved pairs, rescaled to a 16x16 grid), packed SwiGLU.
    ("eva02", "eva02_tiny_patch14_224.mim_in22k", {}, 168),
    # EVA02-B: separate q/k/v (k without bias), SwiGLU with its sub-LN, a classifier.
    ("eva02 sub-LN", "eva02_base_patch14_448.mim_in22k_ft_in22k_in1k", {}, 224),
    # EVA02-CLIP: the attention's own sub-LN, [cls] pooling.
    ("eva02-clip", "eva02_base_patch16_clip_224.merged2b", {}, 160),
    # EVA02-CLIP-E: post-norm blocks, no rotary embedding.
    ("eva02-clip post-norm", "eva02_enormous_patch14_clip_224.laion2b", {}, 168),
    # EVA-01: absolute positions only, mean pooling with fc_norm.
    ("eva-01", "eva_giant_patch14_224.clip_ft_in1k", {}, 168),
    # DINOv3: its own RoPE (centred coordinates, halves), 4 registers, LayerScale, no qkv bias.
    ("dinov3", "vit_small_patch16_dinov3.lvd1689m", {}, 160),
    ("dinov3 qkvb", "vit_small_patch16_dinov3_qkvb.lvd1689m", {}, 160),
    # Perception Encoder core: pre-norm, RoPE (xy, offset 1), absolute positions, attention pooling.
    ("pe core", "vit_pe_core_tiny_patch16_384.fb", {}, 256),
    ("pe lang", "vit_pe_lang_large_patch14_448.fb_tiling", {}, 224),
    ("pe spatial", "vit_pe_spatial_tiny_patch16_512.fb", {}, 256),
    # ROPE-ViT: AttentionRope, axial (temperature 100) or mixed (learned frequencies), with APE.
    ("rope-vit axial", "vit_small_patch16_rope_224.naver_in1k", {}, 160),
    ("rope-vit mixed", "vit_small_patch16_rope_mixed_224.naver_in1k", {}, 160),
    ("rope-vit axial ape", "vit_small_patch16_rope_ape_224.naver_in1k", {}, 160),
    ("rope-vit mixed ape", "vit_small_patch16_rope_mixed_ape_224.naver_in1k", {}, 160),
    # timm's SBB rope-reg ViTs: no [cls], a register, mean pooling.
    ("rope-reg gap", "vit_medium_patch16_rope_reg1_gap_256.sbb_in1k", {}, 192),
    # LingBot: DINOv3's kind with [cls] pooling.
    ("lingbot", "vit_small_patch16_lingbot.robbyant", {}, 160),
    # Sapiens2: grouped-query attention (one block of 1 kv head), qk-norm, RmsNorm, 1024x768.
    ("sapiens2 gqa", "vit_base_patch16_sapiens2.fb", dict(num_kv_heads=(2, 1)), (256, 192)),
]  # fmt: skip


def _randomize(reference):
    """Random LayerScale, biases, norms and head, so each shows in the outputs."""
    for key, parameter in reference.named_parameters():
        if key.endswith(("gamma_1", "gamma_2", "latent", "q_bias", "v_bias")) or "norm" in key:
            parameter.copy_(torch.randn_like(parameter) * 0.5 + (1 if "weight" in key else 0))
        elif key.startswith("head."):
            parameter.copy_(torch.randn_like(parameter) * 0.2)


@pytest.fixture(scope="module", params=KINDS, ids=[kind for kind, *_ in KINDS])
def kind(request, tmp_path_factory):
    """The kind's repo written once, and keras-vit's model of it at the tag's size loaded once,
    for every test of the kind (timm_reference.ReferenceKind)."""
    return reference_kind(request.param, _randomize, tmp_path_factory.mktemp("hub-cache"))


def test_a_tag_of_each_kind_gives_timms_outputs_at_its_size_and_another(kind, hub_cache, record_parity):
    for image_size in (kind.size, kind.other_size):
        by_timm, model = kind.models_at(image_size)
        assert model.count_params() == sum(p.numel() for p in by_timm.parameters())
        assert keras_vit.parameter_count(model) == model.count_params()
        difference = largest_difference(model, by_timm, _pixels(image_size))
        side = "x".join(map(str, image_size)) if isinstance(image_size, tuple) else image_size
        record_parity(f"timm {kind.tag.split('.')[0]} (tiny; {kind.name}), {side} px", difference, 1e-4)
        assert difference < 1e-4


def test_each_kind_survives_a_keras_round_trip_and_num_classes_gives_a_new_head(kind, hub_cache, tmp_path):
    model = keras_vit.create_model(kind.hub_name, pretrained=True, num_classes=3)
    assert model.num_classes == 3 and model.class_names is None
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert restored.get_config() == model.get_config()
    pixels = _pixels(tuple(model.image_size), seed=1)
    np.testing.assert_array_equal(np.asarray(restored(pixels)), np.asarray(model(pixels)))
    assert np.asarray(model(pixels)).shape == (2, 3)


def test_every_tag_of_timms_eva_module_resolves_by_name():
    from keras_vit.model.eva.configs import TIMM_UNBUILT

    table = keras_vit.model.pretrained.pretrained_table()["tags"]
    tags = [tag for name in timm.list_models(module="eva") for tag in timm.list_pretrained(f"{name}.*")]
    assert len(tags) == 83 and not TIMM_UNBUILT
    assert all(tag in table for tag in tags)


@pytest.mark.parametrize("name", sorted(keras_vit.model.eva.configs.MODEL_CONFIGS))
def test_the_analytic_parameter_count_is_timms(name):
    """Every architecture of timm's eva module, on timm's full-size model on PyTorch's meta device
    (shapes only): the 7B and 5B included."""
    model = on_meta(name, num_classes=1000)
    assert keras_vit.parameter_count(name, num_classes=1000) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "parts",
    [
        dict(use_rot_pos_emb=True, swiglu_mlp=True, mlp_ratio=8 / 3, ref_feat_shape=(16, 16)),  # EVA02
        dict(use_rot_pos_emb=True, rope_type="dinov3", rope_rotate_half=True, num_reg_tokens=4,
             init_values=1e-5, use_abs_pos_emb=False, qkv_bias=False),  # DINOv3
        dict(use_rot_pos_emb=True, rope_type="mixed", attn_type="rope", rope_grid_indexing="xy",
             global_pool="token"),  # ROPE-ViT mixed
    ],
    ids=["eva02", "dinov3", "rope-mixed"],
)  # fmt: skip
def test_each_rotary_kind_exports_to_tflite_builtins_and_onnx_with_the_same_outputs_and_its_op_groups(parts):
    import onnxruntime
    from ai_edge_litert.interpreter import Interpreter

    from keras_vit.export import onnx_model, tflite, tflite_graph
    from keras_vit.inference.classifier import load_classifier
    from keras_vit.inference.runtimes import xnnpack_delegation

    model = keras_vit.Eva(
        image_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=5, **parts
    )
    rng = np.random.default_rng(10)  # weights large enough for the positions to show in the outputs
    model.set_weights([rng.normal(0, 0.3, w.shape).astype("float32") for w in model.get_weights()])
    flatbuffer = tflite.convert(load_classifier(model), "fp32")  # raises on a Flex or custom op
    pixels = _pixels(32, seed=2)[:1]
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(pixels)))
    interpreter = Interpreter(model_content=flatbuffer)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], pixels)
    interpreter.invoke()
    outputs = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    np.testing.assert_allclose(outputs, expected, atol=1e-5)
    taken, outside, partitions = xnnpack_delegation(interpreter)  # XNNPACK takes every op
    assert taken > 0 and (outside, partitions) == (0, 1)
    session = onnxruntime.InferenceSession(onnx_model.convert(load_classifier(model)))
    np.testing.assert_allclose(session.run(None, {"images": pixels})[0], expected, atol=1e-5)
    # The family's quantisation op groups and layer-decay layers find their ops by name.
    from keras_vit.export import quantize
    from keras_vit.model.registry import family_of

    family = family_of(model)
    counts = {
        group: quantize.matching_ops(flatbuffer, rules) for group, rules in quantize.groups(family).items()
    }
    assert counts["QKV projections"] == counts["out projections"] == counts["softmax"] == 1
    assert counts["MLP projections"] == 2 and counts["residual adds"] == 2 and counts["rotary embedding"] > 0
    # The attention-rollout map exports too (builtins only), one map over the patch grid.
    rollout = family.attention_rollout(model)(pixels)
    assert (
        tuple(rollout["attention"].shape) == (1, 4, 4) and float(keras.ops.max(rollout["attention"])) == 1.0
    )
    with_attention = Interpreter(model_content=tflite.convert_with_attention(load_classifier(model)))
    with_attention.allocate_tensors()
    assert sorted(tuple(d["shape"]) for d in with_attention.get_output_details()) == [(1, 4, 4), (1, 5)]
    layers, _ = family.layer_groups(model)
    assert all(
        quantize.matching_ops(flatbuffer, quantize.layer_rules(name)) for name in ("patch_embed", "block_0")
    )
    # The integer-only variant converts (the rotation's sign is in the sine table: TFLite has no
    # 16-bit NEG) with no op in float, and gives Keras' probabilities to its 16-bit steps.
    classifier = load_classifier(model)
    strict = tflite.convert(classifier, "int8_strict", tflite.Calibration(classifier, _pixels(32, seed=3)))
    assert not tflite_graph.float_ops(strict)
    assert "NEG" not in {name for name, _, _ in tflite_graph.ops(strict)}
    strict_interpreter = Interpreter(model_content=strict)
    strict_interpreter.allocate_tensors()
    given, output = strict_interpreter.get_input_details()[0], strict_interpreter.get_output_details()[0]
    pixel_bytes = np.round(pixels)
    strict_interpreter.set_tensor(given["index"], pixel_bytes.astype(given["dtype"]))
    strict_interpreter.invoke()
    scale, zero_point = output["quantization"]
    probabilities = (strict_interpreter.get_tensor(output["index"]).astype("float32") - zero_point) * scale
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(pixel_bytes)))
    # Measured 2e-3 to 1.6e-2 over the three kinds (uint8 probabilities: steps of 1/256).
    assert np.abs(probabilities - expected).max() < 3e-2


def test_each_kinds_block_features_are_timms(kind, hub_cache):
    """`forward_intermediates`' patch tokens of every block, through the final norm."""
    from keras_vit.model.features import intermediates

    model, reference = kind.model, kind.reference
    pixels = _pixels(tuple(model.image_size), seed=4)
    config = reference.pretrained_cfg
    x = torch.from_numpy(
        ((pixels / 255 - np.array(config["mean"])) / np.array(config["std"])).transpose(0, 3, 1, 2)
    )
    with torch.no_grad():
        expected = reference.eval().forward_intermediates(
            x.float(), indices=[0, 1], norm=True, output_fmt="NLC", intermediates_only=True
        )
    for mine, theirs in zip(intermediates(model, pixels, indices=[0, 1], norm=True), expected, strict=True):
        mine = np.asarray(mine).reshape(theirs.shape)
        assert np.abs(mine - theirs.numpy()).max() < 1e-4


def test_the_family_declares_what_training_asks(tmp_path):
    """Layer-decay groups, weights without decay and LoRA's targets, on a separate-qkv Eva."""
    from keras_vit.model.registry import family_of
    from keras_vit.training.optimizers import layer_decay_multipliers

    model = keras_vit.Eva(
        image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, qkv_fused=False,
        swiglu_mlp=True, scale_mlp=True, init_values=1e-5, use_rot_pos_emb=True, rope_type="mixed",
        attn_type="rope", num_reg_tokens=1,
    )  # fmt: skip
    family = family_of(model)
    multipliers = layer_decay_multipliers(model, 0.5)
    assert (
        multipliers["patch_embed"] == 0.5**3 and multipliers["block_1"] == 0.5 and "head" not in multipliers
    )
    no_decay = [v.path for v in model.weights if any(name in v.path for name in family.no_weight_decay)]
    assert {"patch_embed/cls_token", "patch_embed/reg_token", "rope/freqs", "block_0/gamma_1"} <= set(
        no_decay
    )
    assert not [path for path in no_decay if path.endswith("kernel")]
    keras_vit.enable_lora(model, rank=2, targets=("attention", "mlp"))
    trainable = {v.path.rsplit("/", 1)[0] for v in model.trainable_weights if "lora" in v.path}
    # q, k and v projections, the output projection, SwiGLU's two inputs and fc2, in each block
    assert len(trainable) == 2 * 7 and np.asarray(model(_pixels(32))).shape == (2, 5)


@pytest.mark.parametrize("published", ["eva02", "dinov3", "pe core", "rope-vit mixed ape"])
def test_a_kind_publishes_for_timm_with_the_same_outputs(published, hub_cache, tmp_path):
    """`save_pretrained` writes the architecture and the model_args that timm builds it from."""
    _, tag, extra, _ = next(entry for entry in KINDS if entry[0] == published)
    model_args = dict(SMALL, **extra)
    torch.manual_seed(6)
    folder = HUB.repo_folder(f"tests/{tag}")
    shutil.rmtree(folder, ignore_errors=True)
    save_for_hf(timm.create_model(tag, pretrained=False, **model_args), folder, model_args=model_args)
    model = keras_vit.create_model(f"hf-hub:tests/{tag}", pretrained=True, num_classes=4)
    published_folder = keras_vit.save_pretrained(model, tmp_path / "published")
    by_timm = timm.create_model(f"local-dir:{published_folder}", pretrained=True)
    assert largest_difference(model, by_timm, _pixels(tuple(model.image_size), seed=3)) < 1e-4


@pytest.mark.parametrize(
    "config",
    [
        dict(num_register_tokens=2),  # DINOv3-S/B/L: no key bias, GELU MLP
        dict(use_gated_mlp=True, hidden_act="silu", key_bias=True),  # DINOv3-7B's gated MLP; all biases
    ],
    ids=["dinov3", "dinov3 gated"],
)
def test_a_transformers_dinov3_repo_gives_its_pooler_output(config, hub_cache, record_parity, tmp_path):
    """transformers' DINOv3ViTModel layout, with transformers' meaning: `pooler_output` ([cls])."""
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    torch.manual_seed(7)
    reference = DINOv3ViTModel(
        DINOv3ViTConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            image_size=64,
            **config,
        )
    ).eval()
    with torch.no_grad():
        for key, parameter in reference.named_parameters():
            if "lambda1" in key or "norm" in key or "register" in key:
                parameter.copy_(torch.randn_like(parameter) * 0.5 + (1 if "weight" in key else 0))
    folder = HUB.repo_folder("tests/dinov3-vit-tiny")
    shutil.rmtree(folder, ignore_errors=True)
    reference.save_pretrained(folder)
    model = keras_vit.create_model("hf-hub:tests/dinov3-vit-tiny", pretrained=True)
    assert not model.include_top and model.global_pool == "token"
    pixels = _pixels(64, seed=8)
    x = (pixels / 255 - np.array(model.image_mean)) / np.array(model.image_std)
    with torch.no_grad():
        expected = reference(pixel_values=torch.from_numpy(x.transpose(0, 3, 1, 2)).float()).pooler_output
    difference = np.abs(np.asarray(model(pixels)) - expected.numpy()).max()
    kind = "gated MLP" if config.get("use_gated_mlp") else "registers"
    record_parity(f"transformers DINOv3ViTModel (tiny; {kind}), pooler_output", difference, 1e-4)
    assert difference < 1e-4
    # Published in timm's layout, timm builds it with the same output ([cls] pooling in model_args).
    published = keras_vit.save_pretrained(model, tmp_path / "published")
    by_timm = timm.create_model(f"local-dir:{published}", pretrained=True)
    assert largest_difference(model, by_timm, pixels) < 1e-4


@pytest.mark.parametrize("kind", ["cat", "dinov3", "mixed"])
def test_timms_train_time_rotary_augmentations_move_positions_in_training_only(kind):
    arguments = dict(
        image_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3, use_rot_pos_emb=True,
        rope_type=kind, rope_rotate_half=kind == "dinov3",
    )  # fmt: skip
    plain = keras_vit.Eva(**arguments)
    # The draws seeded: unseeded, one run in a few dozen drew shifts and scales so near the
    # identity that the 1-block model's logits moved by under 1e-4 (measured: 2.5e-5 at worst).
    keras.utils.set_random_seed(3)
    augmented = keras_vit.Eva(
        **arguments, rope_shift_coords=0.5, rope_jitter_coords=1.5, rope_rescale_coords=2.0
    )
    rng = np.random.default_rng(9)  # weights large enough for the positions to show in the logits
    plain.set_weights([rng.normal(0, 0.5, w.shape).astype("float32") for w in plain.get_weights()])
    augmented.set_weights(plain.get_weights())
    pixels = _pixels(32)
    np.testing.assert_allclose(np.asarray(augmented(pixels)), np.asarray(plain(pixels)), atol=1e-6)
    first, second = (np.asarray(augmented(pixels, training=True)) for _ in range(2))
    assert np.abs(first - second).max() > 1e-4 and np.abs(first - np.asarray(plain(pixels))).max() > 1e-4
    # Where the draws act: the rotary tables themselves move by far more than rounding.
    (rope,) = [layer for layer in augmented._flatten_layers() if isinstance(layer, RotaryEmbedding)]
    tokens = ops.zeros((1, 16, 32))
    moved = np.abs(np.asarray(rope(tokens, training=True)) - np.asarray(rope(tokens, training=False)))
    assert moved.max() > 1e-2


@pytest.mark.parametrize(
    "rotate_half, by_product",
    [(False, True), (False, False), (True, False)],
    ids=["interleaved pairs, TensorFlow's product", "interleaved pairs, JAX's flip", "halves"],
)
def test_the_rotation_equals_timms_formula_to_the_bit(rotate_half, by_product, monkeypatch):
    """`rotate`: `x * cos + rot(x) * sin`, timm's `rot` (EVA02's interleaved pairs `(a, b) -> (-b, a)`,
    or `rotate_half`'s halves). The interleaved swap is a product by a permutation matrix on
    TensorFlow (one FULLY_CONNECTED in the exports, where a split and a concatenation over an axis
    of 2 were slow) and a flip of each pair on JAX: both exact."""
    from keras_vit.model.eva import layers

    monkeypatch.setattr(layers, "swaps_pairs_by_product", lambda: by_product)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 3, 17, 16)).astype("float32")
    sin, cos = rng.normal(size=(2, 1, 17, 16)).astype("float32")
    if rotate_half:
        swapped = np.concatenate([-x[..., 8:], x[..., :8]], axis=-1)
    else:
        swapped = np.stack([-x[..., 1::2], x[..., ::2]], axis=-1).reshape(x.shape)
    expected = x * cos + swapped * sin
    np.testing.assert_array_equal(ops.convert_to_numpy(layers.rotate(x, sin, cos, rotate_half)), expected)
