"""What a ViT classifier's exports run: the model's answers, computing only what its head reads.

A head that pools the [cls] token (and DeiT's distillation token after it) reads those tokens
alone from the last block, and everything in a block but attention works token by token. So the
last block computes their attention rows, output projection and MLP alone; its QKV projection
still runs on every token (the keys and values). The answers are the model's own to float
rounding, for most of one block's work less: 6% of a 12-block ViT's multiply-adds at 224
(DINOv2-S/14: 12.25 -> 11.47 GFLOP). A model pooled by average or by a MAP probe reads every
token of the last block, and runs whole. The Keras model is unchanged: training, features and
attention maps see every token.

    forward = keras_vit.model.vit.classify.classifier_forward(model)
    logits = forward(images)  # model(images, training=False), to float rounding
"""

import keras

from keras_vit.model.vit.attention import head_model, through_the_chain
from keras_vit.model.vit.layers import MultiHeadSelfAttention, ResPostBlock, TransformerBlock, blocks_of


def classifier_forward(model):
    """A callable from images to `model`'s outputs (inference) that skips the last block's work on
    tokens the head does not read; `model` itself when its head reads every token."""
    reads = read_tokens(model)
    if reads is None:
        return model
    last = _last_block(model)

    def run_blocks(images, block_call):
        def call(block, x, position_bias):
            return block_call(block, x, position_bias=position_bias)

        return through_the_chain(model, images, last, call)

    return ReadTokensForward(model, reads, last, run_blocks)


def read_tokens(model):
    """How many leading tokens `model`'s head reads from the last block (1: [cls]; 2: [cls] and
    DeiT's distillation token), or None when it reads them all or its last block cannot skip."""
    arch = getattr(model, "architecture", None)
    if arch is None or arch.pooling != "token" or not arch.class_token:
        return None
    last = _last_block(model)
    if last is None:
        return None
    if type(last)._forward not in (TransformerBlock._forward, ResPostBlock._forward):
        return None  # a parallel-scaling block, or a kind of the exports' own (`export.rotate`)
    if not isinstance(last.attention, MultiHeadSelfAttention):
        return None  # differential attention
    return 2 if arch.distillation_token else 1


def _last_block(model):
    blocks = blocks_of(model)
    return blocks[-1] if blocks else None


class ReadTokensForward:
    """`model` at inference with its last block computing only the first `reads` tokens (every
    family whose head reads leading tokens: the ViT's here, the Eva's in `eva.classify`).

    Args:
        model: the classifier.
        reads: int. The leading tokens the head reads from `last_block`.
        last_block: the model's last block; it takes `queries=`.
        run_blocks: `run_blocks(images, block_call)` calls the model's layers up to and including
            `last_block` at inference, each block as `block_call(block, x, **its inputs)`, and
            returns the last block's output.
    """

    def __init__(self, model, reads, last_block, run_blocks):
        self.model = model
        self.reads = reads
        self.last_block = last_block
        self.run_blocks = run_blocks
        # The layers after the last block (norm, pooling, the head or DeiT's two), called again
        # (same weights) on the tokens it reads.
        head = head_model(model, last_block)
        tokens = keras.Input((reads, head.input_shape[-1]))
        self.head = keras.models.clone_model(head, input_tensors=tokens, clone_function=lambda layer: layer)

    def __call__(self, images, training=False):
        if training:
            raise ValueError("A classifier's forward is for inference; train the Keras model itself.")

        def block_call(block, x, **inputs):
            queries = self.reads if block is self.last_block else None
            return block(x, training=False, queries=queries, **inputs)

        # Under the model's name, as its own call: the quantisation recipes find ops by
        # "<model>/<layer>/..." (export.quantize).
        with keras.name_scope(self.model.name):
            return self.head(self.run_blocks(images, block_call), training=False)
