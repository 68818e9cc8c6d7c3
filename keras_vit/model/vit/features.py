"""Features for dense tasks: the patch tokens of chosen blocks, as timm's `forward_intermediates`.

    grids = keras_vit.model.features.intermediates(model, images, indices=[3, 7, 11], norm=True)
    # [(batch, rows, columns, width), ...]: one grid of patch features per block asked for

Segmentation and detection heads (ViTDet, DPT, UPerNet) read a ViT's tokens at several
depths. `intermediates` returns them in timm's order and with timm's choices (`indices`:
the last n blocks for an int, those blocks for a list, every block for None; `norm`:
through the final LayerNorm), equal to timm's on the same weights, channels last.
`features_model` wraps the same computation in a Keras model, which exports as a
SavedModel (`model.export(path)`: its `serve` signature returns one tensor per block).
"""

import keras
from keras import ops

from keras_vit.model.family import take_indices as block_indices
from keras_vit.model.vit.layers import PatchEncoder, RelativePositionBias, blocks_of

OUTPUTS = ("grid", "tokens")


def intermediates(
    model, images, indices=None, norm=False, output="grid", stop_early=True, prefix_tokens=False
):
    """The patch tokens after the blocks in `indices`, for a `keras_vit.ViT`.

    Args:
        model: a `keras_vit.ViT` (any pooling or head; only the encoder runs).
        images: `(batch, height, width, channels)` at the model's size, as the model takes them.
        indices: see `block_indices`.
        norm: pass each through the model's final per-token LayerNorm (timm's `norm=True`);
            a model whose LayerNorm follows a `"gap"` pooling (timm's `fc_norm`) has none,
            and its features stay as they are, as in timm.
        output: `"grid"`: `(batch, rows, columns, width)`; `"tokens"`: `(batch, patches, width)`.
        stop_early: run no block after the last one asked for.
        prefix_tokens: also return each block's [cls] token, `(batch, 1, width)`.

    Returns:
        A list with one array per index, in order; with `prefix_tokens`, `(features, prefix)` pairs.
    """
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}.")
    blocks = blocks_of(model)
    if not blocks:
        raise ValueError(f"{model.name} has no TransformerBlock layers, so it has no features to take.")
    take = block_indices(len(blocks), indices)
    encoder = next(layer for layer in model.layers if isinstance(layer, PatchEncoder))
    x = images
    shared = None  # a relative position bias all blocks share
    # Normalisation, patch embedding and CLIP's LayerNorm before the blocks.
    for layer in model.layers[1 : model.layers.index(blocks[0])]:
        if isinstance(layer, RelativePositionBias):
            shared = layer(x, training=False)
        else:
            x = layer(x, training=False)
    rows, columns = encoder.grid_size
    prefix_count = encoder.num_prefix_tokens
    last = max(take) if stop_early else len(blocks) - 1
    collected = {}
    for i, block in enumerate(blocks[: last + 1]):
        x = block(x, training=False, position_bias=shared)
        if i in take:
            collected[i] = model.get_layer("norm")(x) if norm and _norms_tokens(model) else x
    results = []
    for i in take:
        tokens = collected[i]
        patches = tokens[:, prefix_count:]
        if output == "grid":
            patches = ops.reshape(patches, (-1, rows, columns, patches.shape[-1]))
        results.append((patches, tokens[:, :prefix_count]) if prefix_tokens else patches)
    return results


def features_model(model, indices=None, norm=False, output="grid"):
    """A Keras model from `model`'s images to `{"block_<i>": features}` for the blocks in `indices`."""
    images = keras.Input(shape=model.input_shape[1:], name="images")
    take = block_indices(len(blocks_of(model)), indices)
    features = intermediates(model, images, take, norm=norm, output=output)
    outputs = {f"block_{i}": f for i, f in zip(take, features, strict=True)}
    return keras.Model(images, outputs, name=f"{model.name}_features")


def _norms_tokens(model):
    """Whether the model's final LayerNorm acts on every token (timm's `norm`, not `fc_norm`)."""
    return model.final_norm and not model.architecture.norm_after_pooling
