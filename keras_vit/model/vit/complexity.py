"""Analytic parameter counts and FLOPs of any ViT configuration (keras-free).

FLOPs count each multiply-accumulate of the matrix products (a hybrid's
convolutions, the patch projection, QKV, attention scores, attention-weighted values, output
projection, MLP, pre-logits, head) as 2 floating-point operations, the
convention of MFU figures and of PyTorch's FlopCounterMode. Normalisation,
softmax, GELU and additions are left out: under 1% at real sizes. Training
costs about 3x the forward pass (forward, plus two products per weight
product backward).
"""

import math

from keras_vit.model.vit.architecture import CONVSTEM_STRIDES, RESNETV2_CHANNELS, RESNETV2_STEM_CHANNELS


def _heads(arch):
    return 2 if arch.distillation_token else 1


# Per MLP kind: (the layers before the activation as multiples of mlp_dim, fc2's input as a
# fraction of it), as `layers.MLPS`.
_MLP_SHAPES = {"mlp": (1, 1), "swiglu": (2, 1), "swiglu_packed": (1, 0.5)}


def _mlp_macs(a, tokens):
    """(weights, multiply-accumulates for `tokens` tokens) of a block's MLP, without biases."""
    widths, into_fc2 = _MLP_SHAPES[a.mlp]
    d, m = a.hidden_dim, a.mlp_dim
    weights = widths * d * m + int(m * into_fc2) * d
    return weights, tokens * weights


def _attention_pool(a):
    """(parameters, multiply-accumulates) of the "map" pooling (timm's AttentionPoolLatent)."""
    d, m, n = a.hidden_dim, a.mlp_dim, a.num_patches + a.prefix_tokens - a.pooled_prefix_tokens
    parameters = d + (d * d + d) + (2 * d * d + 2 * d) + (d * d + d) + 2 * d + (d * m + m) + (m * d + d)
    macs = d * d + n * 2 * d * d + 2 * n * d + d * d + 2 * d * m
    return parameters, macs


def _resnetv2(a):
    """(parameters, multiply-accumulates) of a hybrid's ResNetV2 stem: bias-free convolutions and
    GroupNorms (timm's `_resnetv2`)."""
    size = [math.ceil(side / 2) for side in a.image_size]  # the stem's stride-2 convolution
    parameters = 7 * 7 * a.channels * RESNETV2_STEM_CHANNELS + 2 * RESNETV2_STEM_CHANNELS
    macs = size[0] * size[1] * 7 * 7 * a.channels * RESNETV2_STEM_CHANNELS
    size = [math.ceil(side / 2) for side in size]  # the max pooling
    channels = RESNETV2_STEM_CHANNELS
    widths = RESNETV2_CHANNELS[: len(a.stem_depths)]
    for stage, (depth, out) in enumerate(zip(a.stem_depths, widths, strict=True)):
        middle = out // 4
        for index in range(depth):
            before = size
            if stage and not index:
                size = [math.ceil(side / 2) for side in size]
            pixels = size[0] * size[1]
            parameters += channels * middle + 9 * middle * middle + middle * out + 2 * (2 * middle + out)
            macs += before[0] * before[1] * channels * middle + pixels * (9 * middle * middle + middle * out)
            if not index:  # the projected shortcut
                parameters += channels * out + 2 * out
                macs += pixels * channels * out
            channels = out
    return parameters, macs


def _convstem(a):
    """(parameters as timm counts them: BatchNorm's running statistics are buffers,
    multiply-accumulates) of MobileCLIP's ConvStem."""
    quarter, d = a.hidden_dim // 4, a.hidden_dim
    rows, cols = a.image_size
    parameters, macs, channels = 0, 0, a.channels
    for i, (width, stride) in enumerate(zip((quarter, quarter, d), CONVSTEM_STRIDES, strict=True)):
        rows, cols = rows // stride, cols // stride
        weights = stride * stride * channels * width
        parameters += weights + (width if i == 2 else 2 * width)  # a bias, or BatchNorm's scale and shift
        macs += rows * cols * weights
        channels = width
    return parameters, macs


def _stem(a):
    """(parameters, multiply-accumulates) of the stem, or (0, 0)."""
    return {None: lambda a: (0, 0), "resnetv2": _resnetv2, "convstem": _convstem}[a.stem](a)


def _patch_projection(a):
    """Weights of the patch projection (none after a stem that projects itself), without bias."""
    return 0 if a.stem == "convstem" else a.patch_size**2 * a.feature_channels * a.hidden_dim


def _position_bias(a):
    """(parameters, multiply-accumulates) of one relative position bias: timm's `RelPosMlp` runs
    its MLP on every offset of the grid; `RelPosBias` is a table."""
    rows, cols = a.grid_size
    offsets = (2 * rows - 1) * (2 * cols - 1)
    if a.position_bias == "table":
        return (offsets + 3 * a.prefix_tokens) * a.num_heads, 0
    hidden, heads = a.position_bias_dim, a.num_heads
    weights = 2 * hidden + hidden * heads
    return weights + hidden + heads, offsets * weights


def _position_biases(a):
    """How many relative position biases the model computes: one per block, one shared or none."""
    if a.position_bias is None:
        return 0
    return 1 if a.shared_position_bias else a.depth


def _norm(a):
    """Weights of one norm: a LayerNorm's scale and offset, or an RmsNorm's scale."""
    return a.hidden_dim * (1 if a.norm == "rmsnorm" else 2)


def _block_parameters(a):
    """Weights of one block: timm's `Block` (pre- or post-norm) or `ParallelScalingBlock`."""
    d, m = a.hidden_dim, a.mlp_dim
    if a.block == "parallel":  # in_norm, in_proj (MLP and QKV), the two output projections
        block = _norm(a) + d * (m + 3 * d) + (m + 3 * d if a.qkv_bias else m) + d * d + m * d
        out_projections = 1 if a.attention == "diff" else 2  # DiffParallelScalingBlock fuses them
        block += out_projections * d if a.proj_bias else 0
        block += d if a.layer_scale is not None else 0
    else:
        widths, _ = _MLP_SHAPES[a.mlp]
        mlp_biases = widths * m + d if a.proj_bias else 0
        attention = d * 3 * d + (3 * d if a.qkv_bias else 0) + d * d + (d if a.proj_bias else 0)
        block = 2 * _norm(a) + attention + _mlp_macs(a, 1)[0] + mlp_biases
        if a.layer_scale is not None and a.block == "pre_norm":  # post-norm: the norms' initial scale
            block += 2 * d
        block += 2 * d if a.scale_attention_norm else 0
        block += 2 * int(m * _MLP_SHAPES[a.mlp][1]) if a.scale_mlp_norm else 0  # on fc2's input
    if a.attention == "diff":  # four lambdas and sub_norm, each half a head wide or a head
        block += 3 * d // a.num_heads
    return block


def parameter_count(a):
    """Number of weights of a ViT's `Architecture`."""
    d = a.hidden_dim
    prefix = a.prefix_tokens
    position_tokens = a.num_patches + (prefix if a.cls_position_embedding else 0)
    if a.position_bias is not None:
        position_tokens = 0  # a relative position bias instead
    projection_bias = 0 if a.pre_norm or a.stem == "convstem" else d
    embed = _patch_projection(a) + projection_bias + prefix * d + position_tokens * d + _stem(a)[0]
    block = _block_parameters(a)
    norms = _norm(a) * (int(a.pre_norm) + int(a.final_norm) + int(a.embed_norm))
    total = embed + a.depth * block + norms + _position_biases(a) * _position_bias(a)[0]
    if a.pooling == "map":
        total += _attention_pool(a)[0]
    features = d
    if a.representation_size:
        total += d * a.representation_size + a.representation_size
        features = a.representation_size
    if a.include_top:
        total += _heads(a) * (features * a.num_classes + a.num_classes)
    return total


def forward_flops(a):
    """FLOPs of one image's forward pass (2 per multiply-accumulate)."""
    d = a.hidden_dim
    n = a.num_patches
    t = n + a.prefix_tokens
    macs = n * _patch_projection(a) + _stem(a)[1]
    # Differential attention, as timm computes it (two attention passes, each over values of a
    # whole head's width), costs 3 t^2 d to softmax attention's 2 t^2 d.
    attention = (3 if a.attention == "diff" else 2) * t * t * d
    per_block = t * d * 3 * d + attention + t * d * d + _mlp_macs(a, t)[1]
    macs += a.depth * per_block + _position_biases(a) * _position_bias(a)[1]
    if a.pooling == "map":
        macs += _attention_pool(a)[1]
    features = d
    if a.representation_size:
        macs += d * a.representation_size
        features = a.representation_size
    if a.include_top:
        macs += _heads(a) * features * a.num_classes
    return 2 * macs
