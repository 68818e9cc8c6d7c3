"""What an Eva classifier's exports run: the model's answers, computing only what its head reads,
as for the ViT (`keras_vit.model.vit.classify`).

An Eva pooled by its [cls] token (timm's `global_pool="token"`: ROPE-ViT, EVA-01 and EVA02-CLIP,
LingBot, Sapiens2) reads that token alone from the last block, so the last block computes its
attention row, output projection and MLP alone. [cls] is a prefix token, which the rotary
embedding leaves as it is: only the keys are rotated there. An Eva pooled by averaging (DINOv3,
the rope-reg gap ViTs) or by PE's attention probe reads every token and runs whole.

    forward = keras_vit.model.eva.classify.classifier_forward(model)
    logits = forward(images)  # model(images, training=False), to float rounding
"""

from keras_vit.model.eva.attention import through_the_blocks
from keras_vit.model.eva.layers import EvaBlock
from keras_vit.model.vit.classify import ReadTokensForward


def classifier_forward(model):
    """`vit.classify.classifier_forward` for an Eva: its last block on [cls] alone, or `model`."""
    reads = read_tokens(model)

    def run_blocks(images, block_call):
        return through_the_blocks(model, images, lambda block, x, rope: block_call(block, x, rope=rope))

    return model if reads is None else ReadTokensForward(model, reads, model.blocks[-1], run_blocks)


def read_tokens(model):
    """1 when `model`'s head reads the [cls] token alone from the last block, else None."""
    arch = getattr(model, "architecture", None)
    if arch is None or arch.global_pool != "token" or not arch.class_token or not arch.depth:
        return None
    if type(model.blocks[-1])._forward is not EvaBlock._forward:
        return None  # a block kind of the exports' own
    return 1
