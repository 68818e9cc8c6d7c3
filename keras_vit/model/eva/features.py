"""An Eva's feature maps for dense tasks: the patch tokens of chosen blocks as grids, channels
last, as timm's `forward_intermediates` (NHWC) gives them."""

import keras

from keras_vit.model.family import take_indices as block_indices


def features_model(model, indices=None, norm=False, **unused):
    """A Keras model from `model`'s images to `{"block_<i>": (batch, rows, cols, width)}`;
    `norm`: each through the final norm (timm's `norm=True`), when the model has one."""
    if unused:
        raise TypeError(f"An Eva's feature maps take indices and norm, not {sorted(unused)}.")
    embed = model.get_layer("patch_embed")
    rows, cols = embed.grid_size
    layers = {layer.name for layer in model.layers}
    outputs = {}
    for i in block_indices(model.depth, indices):
        x = model.get_layer(f"block_{i}").output
        if norm and "norm" in layers:
            x = model.get_layer("norm")(x)
        x = x[:, embed.num_prefix_tokens :]
        outputs[f"block_{i}"] = keras.layers.Reshape((rows, cols, model.embed_dim), name=f"grid_{i}")(x)
    return keras.Model(model.input, outputs, name=f"{model.name}_features")


def intermediates(model, images, indices=None, norm=False, **unused):
    """The feature maps of the blocks in `indices` (None: all; an int n: the last n; a list:
    those), in that order, each (batch, rows, columns, width)."""
    maps = features_model(model, indices, norm=norm, **unused)(images)
    return [maps[f"block_{i}"] for i in block_indices(model.depth, indices)]
