"""What the exports run (`vit.classify`): a head that reads the [cls] token gets the model's own
answers from a last block that computes only the tokens it reads."""

import keras
import numpy as np
import pytest
from conftest import TINY

import keras_vit
from keras_vit.inference.classifier import load_classifier
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


@pytest.mark.parametrize("kind", READS_LEADING_TOKENS)
def test_the_last_block_computes_only_the_tokens_the_head_reads_and_answers_as_the_model(kind, images):
    arguments, tokens = READS_LEADING_TOKENS[kind]
    model = keras_vit.ViT(**TINY, drop_path_rate=0.1, dropout=0.1, **arguments)
    assert read_tokens(model) == tokens
    forward = classifier_forward(model)
    assert forward is not model
    np.testing.assert_allclose(forward(images), model(images, training=False), atol=1e-6)
    last = model.get_layer(f"block_{TINY['depth'] - 1}")
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
    assert into == (2, 64 + model.get_layer("patch_encoder").num_prefix_tokens, TINY["hidden_dim"])
    assert out == (2, tokens, TINY["hidden_dim"])  # the rest of the tokens never computed
    spec = last.compute_output_spec(keras.KerasTensor(into), queries=tokens)
    assert tuple(spec.shape) == out


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
