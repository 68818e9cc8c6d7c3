"""Where a ViT looks: every block's attention weights, and attention rollout from what it
classifies: the [cls] token, the mean of the patch tokens, or a MAP head's probe.

    maps = keras_vit.model.vit.attention.AttentionRollout(model)(images)["attention"]

Attention rollout (Abnar & Zuidema, 2020) follows attention through the
residual stream: each block's head-averaged attention, plus the identity for
the skip connection, rows renormalised, multiplied from the first block to the
last. The [cls] row of the product over the patch tokens says how much each
patch contributed to the classification token. A model pooled by attention (SigLIP's
MAP head) classifies its learned probe's cross-attention over the last block's tokens:
the probe's head-averaged weights times the product. Everything is Keras ops, so the
same graph exports to TFLite with builtin ops only.
"""

import keras
from keras import ops

from keras_vit.model.vit.layers import (
    BLOCK_CLASSES,
    AttentionPoolLatent,
    PatchEncoder,
    RelativePositionBias,
    blocks_of,
)


def attention_scores(model, images, head=None):
    """Runs `model` on `images` and returns `(outputs, scores)`.

    `scores` holds each block's attention weights, `(batch, heads, tokens,
    tokens)` with softmax rows over keys, first block first. The layers up to
    the last block are called in order (a ViT is a chain there), then the rest
    (pooling, norm, the head or DeiT's two heads) as one sub-model, so this
    traces into an exported graph.

    Raises:
        ValueError: `model` has no Transformer blocks.
    """
    tokens, scores = _through_the_blocks(model, images)
    head = head or head_model(model)
    return head(tokens, training=False), scores


def _through_the_blocks(model, images):
    """The last block's tokens and every block's attention weights, first block first."""
    blocks = blocks_of(model)
    if not blocks:
        raise ValueError(f"{model.name} has no TransformerBlock layers, so it has no attention to show.")
    scores = []

    def block_call(block, x, position_bias):
        x, block_scores = block(x, training=False, return_attention_scores=True, position_bias=position_bias)
        scores.append(block_scores)
        return x

    return through_the_chain(model, images, blocks[-1], block_call), scores


def through_the_chain(model, images, last, block_call):
    """Calls `model`'s layers in order (a ViT is a chain up to its last block) on `images`, up to
    and including `last`, at inference; each block as `block_call(block, x, position_bias)`, with
    the relative position bias all blocks share, when the model computes one before the first."""
    x = images
    shared = None
    for layer in model.layers[1 : model.layers.index(last) + 1]:  # after the InputLayer
        if isinstance(layer, BLOCK_CLASSES):
            x = block_call(layer, x, shared)
        elif isinstance(layer, RelativePositionBias):
            shared = layer(x, training=False)
        else:
            x = layer(x, training=False)
    return x


def head_model(model, last_block=None):
    """The layers after a model's last block (pooling, norm, the head or DeiT's two heads) as
    one Keras model; `attention_scores(..., head=)` takes it to skip rebuilding it per call.
    `last_block`: the block they follow (default: the ViT's last), for a family of its own."""
    last_block = blocks_of(model)[-1] if last_block is None else last_block
    return keras.Model(last_block.output, model.output, name=f"{model.name}_head")


def rollout(
    scores, grid_size, num_prefix_tokens=1, residual_weight=0.5, from_cls=True, probe=None, probe_skips=0
):
    """Attention rollout from the [cls] token over the patch grid.

    Args:
        scores: list of `(batch, heads, tokens, tokens)` attention weights, first block first.
        grid_size: `(rows, cols)` of patches.
        num_prefix_tokens: tokens before the patches ([cls] and any others).
        residual_weight: share of the identity (the skip connection) in each block's mix.
        from_cls: follow the [cls] token (token 0); False, for a model pooled by averaging
            with no [cls], follows the mean of the patch tokens, which is what it classifies.
        probe: a MAP head's attention weights, `(batch, heads, 1, tokens read)`: follows the
            probe instead (`from_cls` unused). It reads the last block's tokens after its first
            `probe_skips` (the prefix tokens, unless timm's `pool_include_prefix`).

    Returns:
        `(batch, rows, cols)` float32 maps scaled so each image's largest value is 1.
    """
    result = None
    for block_scores in scores:
        mixed = ops.mean(ops.cast(block_scores, "float32"), axis=1)
        tokens = mixed.shape[-1]
        mixed = (1.0 - residual_weight) * mixed + residual_weight * ops.eye(tokens, dtype="float32")
        mixed = mixed / ops.sum(mixed, axis=-1, keepdims=True)
        result = mixed if result is None else ops.matmul(mixed, result)
    if probe is not None:  # no skip connection around the probe: its weights are the whole mix
        weights = ops.mean(ops.cast(probe, "float32"), axis=1)  # (batch, 1, tokens read)
        row = ops.matmul(weights, result[:, probe_skips:, :])[:, :1, num_prefix_tokens:]
    elif from_cls:  # [:, :1], not [:, 0]: XNNPACK refuses a shrinking STRIDED_SLICE
        row = result[:, :1, num_prefix_tokens:]
    else:
        row = ops.mean(result[:, num_prefix_tokens:, num_prefix_tokens:], axis=1)
    maps = ops.reshape(row, (-1, grid_size[0], grid_size[1]))
    peak = ops.max(maps, axis=(1, 2), keepdims=True)
    return maps / ops.maximum(peak, 1e-12)


class AttentionRollout:
    """Probabilities and attention-rollout maps of a ViT classifier, in one graph.

    `AttentionRollout(model)(images)` returns `{"probabilities": (batch, classes),
    "attention": (batch, rows, cols)}`. `model` outputs logits or softmax
    probabilities; the plain model is left unchanged.
    """

    def __init__(self, model):
        encoders = [layer for layer in model.layers if isinstance(layer, PatchEncoder)]
        if len(encoders) != 1:
            raise ValueError(f"{model.name} is not a ViT (no PatchEncoder); attention rollout needs one.")
        self.grid_size = tuple(encoders[0].grid_size)
        self.num_prefix_tokens = encoders[0].num_prefix_tokens
        self.from_cls = encoders[0].class_token
        self.outputs_probabilities = getattr(model, "classifier_activation", None) == "softmax"
        self.model = model
        self.head = head_model(model)
        # A MAP head runs in three parts, so that its probe's weights come out of the one call
        # that pools: the layers from the last block to it (the final norm), the pooling, the rest.
        self.probe = next((layer for layer in model.layers if isinstance(layer, AttentionPoolLatent)), None)
        if self.probe is not None:
            last_block = blocks_of(model)[-1]
            self.to_probe = keras.Model(last_block.output, self.probe.input, name=f"{model.name}_to_probe")
            self.after_probe = keras.Model(self.probe.output, model.output, name=f"{model.name}_after_probe")

    def __call__(self, images):
        tokens, scores = _through_the_blocks(self.model, images)
        probe = None
        if self.probe is None:
            outputs = self.head(tokens, training=False)
        else:
            pooled, probe = self.probe(self.to_probe(tokens, training=False), return_attention_scores=True)
            outputs = self.after_probe(pooled, training=False)
        outputs = ops.cast(outputs, "float32")
        return {
            "probabilities": outputs if self.outputs_probabilities else ops.softmax(outputs, axis=-1),
            "attention": rollout(
                scores,
                self.grid_size,
                self.num_prefix_tokens,
                from_cls=self.from_cls,
                probe=probe,
                probe_skips=self.probe.num_prefix_tokens if self.probe is not None else 0,
            ),
        }
