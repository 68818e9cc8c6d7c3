"""Feature maps for dense tasks, from a model of any family, as timm's `forward_intermediates`
and `features_only` give them: each family computes its own (`vit/features.py`: the patch tokens
of chosen blocks; `swin/features.py`: the four stage maps).

    grids = keras_vit.features.intermediates(model, images, indices=[3, 7, 11], norm=True)
    features = keras_vit.features.features_model(model, indices=[3, 7, 11], norm=True)
"""

from keras_vit.model import registry


def intermediates(model, images, indices=None, **options):
    """The feature maps of the blocks (ViT) or stages (Swin) in `indices`, channels last, equal
    to timm's on the same weights; `options` are the family's (`norm`, `output`, ...)."""
    return registry.family_of(model).features().intermediates(model, images, indices, **options)


def features_model(model, indices=None, **options):
    """A Keras model from `model`'s images to its feature maps, `{name: (batch, rows, cols, C)}`:
    it exports as a SavedModel (`model.export(path)`) like any Keras model."""
    return registry.family_of(model).features().features_model(model, indices, **options)
