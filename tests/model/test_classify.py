"""What the exports run (`vit.classify`, `eva.classify`): a head that reads the [cls] token gets the
model's own answers from a last block that computes only the tokens it reads."""

import keras
import numpy as np
import pytest
from conftest import TINY
from timm_reference import SMALL

import keras_vit
from keras_vit.inference.classifier import load_classifier
from keras_vit.model.eva import classify as eva_classify
from keras_vit.model.vit.classify import classifier_forward, read_tokens

# Kinds whose head reads the leading tokens alone: (ViT arguments, tokens read).
READS_LEADING_TOKENS = {
    "cls": ({}, 1),
    "distilled": (dict(distillation_token=True), 2),
    "registers, LayerScale, SwiGLU": (dict(register_tokens=2, layer_scale=0.1, mlp="swiglu"), 1),
    "relative positions (own table)": (dict(position_bias="table"), 1),
    "relative positions (shared MLP)": (dict(position_bias="mlp", shared_position_bias=True), 1),
    "post-norm blocks, CLIP's pre-norm": (dict(block="res_post", pre_norm=True, activation="quick_gelu"), 1),
    "pre-logits, softmax head": (dict(representation_size=16, classifier_activation="softmax"), 1),
}
# Kinds whose head reads every token of the last block, or whose last block cannot skip.
READS_EVERY_TOKEN = {
    "average": dict(pooling="gap"),
    "MAP probe": dict(pooling="map"),
    "no [cls]": dict(class_token=False, pooling="gap"),
    "parallel-scaling block": dict(block="parallel"),
    "differential attention": dict(attention="diff"),
}


# The Eva kinds (timm's `eva` tags, tiny) whose head reads the [cls] token, and some that read
# every token. A [cls] token is a prefix token: the rotary embedding leaves it as it is.
EVA_READS_CLS = {
    "EVA02-CLIP (q/k/v apart, SwiGLU, sub-LNs)": "eva02_base_patch16_clip_224",
    "EVA02-CLIP post-norm": "eva02_enormous_patch14_clip_224",
    "EVA-01 CLIP (no rotary embedding)": "eva_giant_patch14_clip_224",
    "ROPE-ViT axial": "vit_base_patch16_rope_224",
    "ROPE-ViT mixed, APE": "vit_base_patch16_rope_mixed_ape_224",
    "LingBot (DINOv3's rotation, registers)": "vit_base_patch16_lingbot",
    "Sapiens2 (grouped-query, qk-norm, RmsNorm, GLU)": "vit_base_patch16_sapiens2",
}
EVA_READS_EVERY_TOKEN = {
    "DINOv3 (average)": "vit_small_patch16_dinov3",
    "PE core (attention probe)": "vit_pe_core_tiny_patch16_384",
    "rope-reg gap (no [cls])": "vit_medium_patch16_rope_reg1_gap_256",
}


def _tiny_eva(tag, **arguments):
    size = 28 if "patch14" in tag else 32
    if "sapiens2" in tag:
        arguments["num_kv_heads"] = (2, 1)  # the last block's two query heads share one key/value head
    model = keras_vit.create_model(tag, num_classes=3, image_size=size, **SMALL, **arguments)
    rng = np.random.default_rng(4)  # weights large enough for every part to show in the outputs
    model.set_weights([rng.normal(0, 0.3, w.shape).astype("float32") for w in model.get_weights()])
    return model, rng.normal(size=(2, size, size, 3)).astype("float32")


def _check_the_last_block_outputs_only_the_read_tokens(last, forward, images, tokens_in, reads, width):
    """Runs `forward` recording the last block's call: it takes every token, returns `reads`."""
    seen = []
    original = last.call

    def recorded(x, **kwargs):
        out = original(x, **kwargs)
        seen.append((tuple(x.shape), tuple(out.shape)))
        return out

    last.call = recorded
    try:
        forward(images)
    finally:
        del last.call
    ((into, out),) = seen
    assert into == (len(images), tokens_in, width)
    assert out == (len(images), reads, width)  # the rest of the tokens never computed
    spec = last.compute_output_spec(keras.KerasTensor(into), queries=reads)
    assert tuple(spec.shape) == out


@pytest.mark.parametrize("kind", READS_LEADING_TOKENS)
def test_the_last_block_computes_only_the_tokens_the_head_reads_and_answers_as_the_model(kind, images):
    arguments, tokens = READS_LEADING_TOKENS[kind]
    model = keras_vit.ViT(**TINY, drop_path_rate=0.1, dropout=0.1, **arguments)
    assert read_tokens(model) == tokens
    forward = classifier_forward(model)
    assert forward is not model
    np.testing.assert_allclose(forward(images), model(images, training=False), atol=1e-6)
    last = model.get_layer(f"block_{TINY['depth'] - 1}")
    prefix = model.get_layer("patch_encoder").num_prefix_tokens
    _check_the_last_block_outputs_only_the_read_tokens(
        last, forward, images, 64 + prefix, tokens, TINY["hidden_dim"]
    )


@pytest.mark.parametrize("kind", EVA_READS_CLS)
def test_an_eva_pooled_by_its_cls_token_computes_only_it_in_the_last_block(kind):
    from keras_vit.model.registry import family_of

    model, images = _tiny_eva(EVA_READS_CLS[kind], drop_path_rate=0.1, dropout=0.1)
    forward = family_of(model).classifier_forward(model)
    assert eva_classify.read_tokens(model) == 1 and forward is not model
    expected = keras.ops.convert_to_numpy(model(images, training=False))
    assert np.abs(expected[0] - expected[1]).max() > 1e-2  # the images show in the outputs
    np.testing.assert_allclose(forward(images), expected, atol=1e-5, rtol=1e-5)
    tokens = model.get_layer("patch_embed").num_patches + model.get_layer("patch_embed").num_prefix_tokens
    _check_the_last_block_outputs_only_the_read_tokens(
        model.blocks[-1], forward, images, tokens, 1, SMALL["embed_dim"]
    )


@pytest.mark.parametrize("kind", EVA_READS_EVERY_TOKEN)
def test_an_eva_whose_head_reads_every_token_runs_whole(kind):
    model, _ = _tiny_eva(EVA_READS_EVERY_TOKEN[kind])
    assert eva_classify.read_tokens(model) is None
    assert eva_classify.classifier_forward(model) is model


def test_only_prefix_tokens_attend_alone_in_an_eva():
    """A patch token's query carries its rotation: the block refuses to compute it alone."""
    model, images = _tiny_eva("vit_base_patch16_lingbot")  # [cls] and 4 registers
    tokens = keras.ops.ones((1, 4 + 5, SMALL["embed_dim"]))
    assert tuple(model.blocks[-1].attention(tokens, queries=5).shape) == (1, 5, SMALL["embed_dim"])
    with pytest.raises(ValueError, match="only prefix tokens attend alone"):
        model.blocks[-1].attention(tokens, queries=6)


@pytest.mark.parametrize("kind", READS_EVERY_TOKEN)
def test_a_head_that_reads_every_token_runs_the_whole_model(kind):
    model = keras_vit.ViT(**TINY, **READS_EVERY_TOKEN[kind])
    assert read_tokens(model) is None
    assert classifier_forward(model) is model


def test_every_export_runs_the_skipping_graph_and_the_keras_model_keeps_every_token(tmp_path, images):
    """The classifier every export is built from runs the skipping graph; the fp32 TFLite file
    computes the last block's MLP on the [cls] token alone; the Keras model is unchanged."""
    from ai_edge_litert.interpreter import Interpreter

    from keras_vit.export import tflite

    model = keras_vit.ViT(**TINY)
    path = tmp_path / "m.keras"
    model.save(path)
    classifier = load_classifier(str(path))
    assert classifier.forward is not classifier.model
    expected = keras.ops.softmax(classifier.model(images, training=False))
    np.testing.assert_allclose(classifier.probabilities(images), expected, atol=1e-6)
    interpreter = Interpreter(model_content=tflite.convert(classifier, "fp32"))
    hidden = {  # the MLP's hidden units, by block
        t["name"].split("/")[1].rsplit("_", 1)[0]: tuple(t["shape"])
        for t in interpreter.get_tensor_details()
        if len(t["shape"]) == 3 and t["shape"][-1] == TINY["mlp_dim"]
    }
    tokens = 64 + 1
    last = f"block_{TINY['depth'] - 1}"
    assert hidden == {**{f"block_{i}": (1, tokens, TINY["mlp_dim"]) for i in range(TINY["depth"] - 1)},
                      last: (1, 1, TINY["mlp_dim"])}, hidden  # fmt: skip
    interpreter.allocate_tensors()
    (entry,), (exit_,) = interpreter.get_input_details(), interpreter.get_output_details()
    interpreter.set_tensor(entry["index"], images[:1])
    interpreter.invoke()
    np.testing.assert_allclose(interpreter.get_tensor(exit_["index"]), expected[:1], atol=1e-5)
    # The Keras model still computes every token of its last block (features, attention maps).
    assert tuple(model.get_layer(last).output.shape) == (None, tokens, TINY["hidden_dim"])
