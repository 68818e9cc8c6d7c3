"""A Swin's feature maps for dense tasks: each stage's output grid, channels last, as timm's
`features_only=True` gives them (`forward_intermediates` with NHWC)."""

import keras

from keras_vit.model.family import take_indices as stage_indices


def intermediates(model, images, indices=None, norm=False, **unused):
    """The outputs of the stages in `indices` (`stage_indices`: None for all, an int n for the
    last n, a list for those), each (batch, rows, columns, width); `norm`: the final LayerNorm
    on the last stage's (timm's `norm=True`, which applies it there only)."""
    if unused:
        raise TypeError(f"A Swin's feature maps take indices and norm, not {sorted(unused)}.")
    stages = len(model.depths)
    take = stage_indices(stages, indices)
    x = images
    for layer in model.layers[1 : _first_stage_layer(model)]:  # the normalisation, if any, and the embedding
        x = layer(x)
    maps = []
    for stage in range(max(take) + 1):
        for layer in model.stage_layers(stage):
            x = layer(x)
        if stage in take:
            maps.append(model.get_layer("norm")(x) if norm and stage == stages - 1 else x)
    return [maps[take_order] for take_order in _order(take)]


def _first_stage_layer(model):
    names = [layer.name for layer in model.layers]
    return names.index("patch_embed") + 1


def _order(take):
    ordered = sorted(take)
    return [ordered.index(stage) for stage in take]


def features_model(model, indices=None, norm=False):
    """A Keras model from `model`'s images to `{"stage_<i>": (batch, rows, cols, width)}`."""
    images = keras.Input(shape=model.input_shape[1:], name="images")
    take = stage_indices(len(model.depths), indices)
    maps = intermediates(model, images, take, norm=norm)
    return keras.Model(
        images, {f"stage_{i}": m for i, m in zip(take, maps, strict=True)}, name=f"{model.name}_features"
    )
