"""The ViT model: any configuration, built as a functional Keras model."""

import keras

from keras_vit.model.family_model import FamilyModel, normalized, set_signature
from keras_vit.model.layers import weight_initializer
from keras_vit.model.relative_position import resize_bias_table
from keras_vit.model.vit import FAMILY
from keras_vit.model.vit.architecture import Architecture, pair
from keras_vit.model.vit.layers import (
    BLOCKS,
    AttentionPoolLatent,
    PatchEncoder,
    RelativePositionBias,
    TokenPooling,
    norm_named,
)
from keras_vit.model.vit.pos_embed import resample_position_embeddings


def _distilled_heads(cls_features, distillation_features, num_classes, activation):
    """DeiT's two heads on the [cls] and distillation tokens, and their mean (timm's inference)."""

    def head(name):
        return keras.layers.Dense(
            num_classes, kernel_initializer=weight_initializer(), dtype="float32", name=name
        )

    logits = keras.layers.Average(dtype="float32", name="distilled_average")(
        [head("head")(cls_features), head("head_dist")(distillation_features)]
    )
    if activation is None:
        return logits
    return keras.layers.Activation(activation, dtype="float32", name="head_activation")(logits)


def distilled_heads(model):
    """A Keras model from a distilled ViT's images to each head's logits: `{"head", "head_dist"}`.

    It shares the ViT's layers: the distillation loss trains `head_dist` toward the teacher.
    """
    if not getattr(model, "distillation_token", False) or not model.include_top:
        raise ValueError(f"{model.name} has no distillation head (ViT(distillation_token=True)).")
    outputs = {name: model.get_layer(name).output for name in ("head", "head_dist")}
    return keras.Model(model.inputs, outputs, name=f"{model.name}_heads")


@keras.saving.register_keras_serializable(package="keras_vit")
class ViT(FamilyModel):
    """Vision Transformer (Dosovitskiy et al., 2020), weight-compatible with timm.

    Takes `(batch, height, width, channels)` float images and returns class
    logits (or probabilities with `classifier_activation="softmax"`). With
    `image_mean` and `image_std` the images are pixel values in [0, 255] and
    the model normalises them itself, so saved and exported models carry
    their preprocessing; without, they must arrive normalised the way the
    weights were trained. With `include_top=False` it returns the pooled,
    normalised embedding of each image instead.

    Args:
        image_size: int or (height, width). Input resolution; each side must
            be a multiple of `patch_size`.
        patch_size: int. Side of the square patches.
        hidden_dim: int. Token width.
        depth: int. Number of Transformer blocks.
        num_heads: int. Attention heads; must divide `hidden_dim`.
        mlp_dim: int. Hidden width of each block's MLP.
        num_classes: int, default 1000. Classifier outputs.
        channels: int, default 3. Image channels (1 for grayscale).
        pooling: how the tokens become one vector (timm's `global_pool`): `"token"` (the
            [cls] token, default), `"gap"` (the mean of the patch tokens; timm's "avg"), `"map"`
            (attention pooling with a learned latent query, `AttentionPoolLatent`: SigLIP's) or
            `"none"` (every token kept, the head applied to each; timm's "").
        representation_size: int or None. Adds the paper's pre-logits layer
            (Dense + tanh) of this width before the classifier.
        include_top: bool, default True. Whether to add the classifier.
        dropout: float, default 0. Dropout on embeddings, attention output and MLPs.
        attention_dropout: float, default 0. Dropout on attention weights.
        drop_path_rate: float, default 0. Stochastic depth rate of the last
            block; it grows linearly from 0 at the first block.
        layer_norm_epsilon: float, default 1e-6. The epsilon of every norm.
        norm: the kind of every norm (timm's `norm_layer`): `"layernorm"` (default) or
            `"rmsnorm"` (AIMv2's; with pre-norm or parallel blocks, not with a `"map"` pooling).
        embed_norm: bool, default False. A norm of that kind on the patch tokens, before the
            position embeddings (timm's `embed_norm_layer`, AIMv2's).
        classifier_activation: None (logits, default) or an activation name
            such as `"softmax"`.
        image_mean: list of floats or None. Per-channel mean on the [0, 1]
            scale, e.g. `[0.5, 0.5, 0.5]`; set with `image_std`.
        image_std: list of floats or None. Per-channel std on the [0, 1] scale.
        class_names: list of str or None. The label of each output, saved
            with the model for prediction and export.
        license: str or None. The licence of the weights, as timm's pretrained_cfg names it
            (`"apache-2.0"`, `"cc-by-nc-4.0"`): a pretrained model carries its repo's, and
            `keras_vit.save_pretrained` writes it back.
        layer_scale: float or None. LayerScale's initial value in every block
            (DeiT III: 1e-6); None (ViT, DeiT) has none.
        cls_position_embedding: bool, default True. False gives position
            embeddings to the patches only (DeiT III; timm's `no_embed_class`).
        class_token: bool, default True. False: no [cls] token (with `pooling="gap"`).
        register_tokens: int, default 0. Register tokens after the other prefix tokens
            (Darcet et al. 2024); they are dropped by the pooling.
        norm_before_pooling: bool or None, default None. Where the final LayerNorm goes: on
            every token before the pooling (True; timm's `fc_norm=False`) or on the pooled vector
            (False; timm's `fc_norm=True`). None is timm's `fc_norm=None`: after a `"gap"`
            pooling, before any other.
        pool_include_prefix: bool, default False. Whether a `"gap"` or `"map"` pooling reads the
            prefix tokens ([cls], registers) too, not the patch tokens alone (timm's
            `pool_include_prefix`, its test_vit3's).
        qkv_bias: bool, default True. Whether the attention's query/key/value projection has a
            bias (timm's `qkv_bias`).
        proj_bias: bool, default True. Whether the attention's output projection and the MLP's
            layers have biases (timm's `proj_bias`).
        pre_norm: bool, default False. A LayerNorm on the tokens before the first block, and no
            bias in the patch projection (CLIP's; timm's `pre_norm`).
        final_norm: bool, default True. False: no LayerNorm after the blocks (timm's
            `final_norm`).
        activation: the MLP's activation (timm's `act_layer`): `"gelu"` (exact, default),
            `"gelu_tanh"`, `"quick_gelu"` (OpenAI CLIP's) or `"silu"`.
        mlp: the MLP's kind (timm's `mlp_layer`): `"mlp"` (default), `"swiglu"` or
            `"swiglu_packed"` (DINOv2-g's); `mlp_dim` is timm's `hidden_features` for each.
        block: the block's kind (timm's `block_fn`): `"pre_norm"` (default; timm's `Block`),
            `"res_post"` (the LayerNorm after each branch, timm's `ResPostBlock`; `layer_scale` is
            then the LayerNorms' initial scale, as timm's `init_values`) or `"parallel"`
            (attention and MLP side by side from one input projection, ViT-22B's; timm's
            `ParallelScalingBlock`).
        attention: the attention's kind (timm's `attn_layer`): `"standard"` (default) or `"diff"`
            (differential attention, timm's `DiffAttention`; in a parallel block, timm's
            `DiffParallelScalingBlock`): the "wee" and "little" ViTs'.
        position_bias: None (default: absolute position embeddings), `"mlp"` or `"table"`: a
            relative position bias in every block's attention instead, timm's
            `VisionTransformerRelPos` (its `rel_pos_type`: `RelPosMlp`, `RelPosBias`);
            `RelativePositionBias` says what each is.
        position_bias_dim: int, default 128. The width of the `"mlp"` bias' MLP (timm's
            `rel_pos_dim`).
        shared_position_bias: bool, default False. One relative position bias that every block
            shares (timm's `shared_rel_pos`, the "srelpos" ViTs), not one per block.
        stem: None (default: the patch projection of the pixels) or `"resnetv2"`: a hybrid ViT,
            whose patch projection reads the feature map of timm's ResNetV2 (BiT's, with weight
            standardisation and GroupNorm; timm's `HybridEmbed`), `ResNetV2Stem`. `patch_size`
            is then in the feature map's cells (1 for the R26 and R50 hybrids).
        stem_depths: list of ints, default (). The ResNetV2's stage depths (`[3, 4, 9]` for
            R50+ViT-B/16); () is its stem alone.
        scale_attention_norm: bool, default False. A LayerNorm on the attention's heads before
            its output projection (BEiT-3's sub-LayerNorms; timm's `scale_attn_norm`).
        scale_mlp_norm: bool, default False. A LayerNorm on the MLP's hidden units before `fc2`
            (timm's `scale_mlp_norm`).
        position_embedding_interpolation: how a checkpoint's position embeddings are resampled
            to another patch grid, and `resize_model`'s: `"bicubic"` (default; timm's, antialiased),
            `"bilinear"` (no antialiasing: timm's for FlexiViT and RADIO), `"bilinear_aligned"`
            (aligned corners too: RADIO-B/H v3's) or `"bicubic_no_antialias"` (PyTorch's bicubic
            without antialiasing: transformers' DINOv2, SigLIP and CLIP).
        distillation_token: bool, default False. DeiT's distilled layout: a second
            prefix token with its own head (`head_dist`); the model returns the mean of
            both heads' logits, as timm does at inference (`distilled_heads` gives each).
        crop_pct, crop_mode, interpolation: how an image is brought to `image_size` to be
            classified, with timm's names and meanings (`keras_vit.model.transform`): a
            checkpoint keeps the transform it was validated with (timm's ViTs: 0.9, "center",
            "bicubic"). Default: a plain bilinear resize (1.0, "squash", "bilinear"). Every
            reader applies it: predict, evaluate, verification, the exports and the apps.
    """

    family_spec = FAMILY  # what the rest of keras-vit asks about the model
    family = FAMILY.name
    architecture_class = Architecture

    def __init__(self, dtype=None, **arguments):
        arch, dtype, images, keras_arguments = self._prologue(dtype, arguments)
        tokens = _stem(images, arch, dtype)
        tokens = _blocks(tokens, arch, dtype)
        outputs = _head(tokens, arch, dtype)
        self._epilogue(images, outputs, arch, dtype, keras_arguments)

    @property
    def blocks(self):
        """The Transformer blocks, in order."""
        return [self.get_layer(f"block_{i}") for i in range(self.depth)]


set_signature(ViT)


def _stem(images, arch, dtype):
    """Pixels to tokens: normalisation (when the model carries it), the patch projection, the
    prefix tokens and the position embeddings."""
    x = normalized(images, arch, dtype)
    encoder = PatchEncoder(
        arch.patch_size,
        arch.hidden_dim,
        dropout=arch.dropout,
        cls_position_embedding=arch.cls_position_embedding,
        distillation_token=arch.distillation_token,
        class_token=arch.class_token,
        register_tokens=arch.register_tokens,
        projection_bias=not arch.pre_norm,  # as timm: a LayerNorm follows, so no bias
        position_embedding=arch.position_bias is None,
        stem=arch.stem,
        stem_depths=arch.stem_depths,
        norm=arch.norm if arch.embed_norm else None,
        norm_epsilon=arch.layer_norm_epsilon,
        dtype=dtype,
        name="patch_encoder",
    )
    tokens = encoder(x)
    if arch.pre_norm:
        tokens = _layer_norm(arch, dtype, "norm_pre")(tokens)
    return tokens


def _layer_norm(arch, dtype, name):
    return norm_named(arch.norm, arch.layer_norm_epsilon, dtype, name)


def _position_bias(arch):
    """`RelativePositionBias`' arguments but its heads, for a ViT with relative positions."""
    if arch.position_bias is None:
        return None
    return dict(
        kind=arch.position_bias,
        grid_size=list(arch.grid_size),
        num_prefix_tokens=arch.prefix_tokens,
        hidden_dim=arch.position_bias_dim,
    )


def _blocks(tokens, arch, dtype):
    """The Transformer blocks, stochastic depth growing linearly to the last (as timm's
    linspace(0, drop_path_rate, depth)); a relative position bias in each block's attention, or
    one that all share, computed once before the first."""
    position_bias = _position_bias(arch)
    shared = None
    if arch.shared_position_bias:
        shared = RelativePositionBias(
            num_heads=arch.num_heads, **position_bias, dtype=dtype, name="position_bias"
        )(tokens)
        position_bias = None
    for i in range(arch.depth):
        block = BLOCKS[arch.block](
            arch.hidden_dim,
            arch.num_heads,
            arch.mlp_dim,
            dropout=arch.dropout,
            attention_dropout=arch.attention_dropout,
            drop_path_rate=arch.drop_path_rate * i / max(arch.depth - 1, 1),
            layer_norm_epsilon=arch.layer_norm_epsilon,
            layer_scale=arch.layer_scale,
            qkv_bias=arch.qkv_bias,
            proj_bias=arch.proj_bias,
            activation=arch.activation,
            mlp=arch.mlp,
            position_bias=position_bias,
            attention=arch.attention,
            depth=i,
            scale_attention_norm=arch.scale_attention_norm,
            scale_mlp_norm=arch.scale_mlp_norm,
            norm=arch.norm,
            dtype=dtype,
            name=f"block_{i}",
        )
        tokens = block(tokens) if shared is None else block(tokens, position_bias=shared)
    return tokens


def _pooling(arch, dtype):
    """The pooling part: `AttentionPoolLatent` for "map", else `TokenPooling`."""
    if arch.pooling == "map":
        return AttentionPoolLatent(
            arch.hidden_dim,
            arch.num_heads,
            arch.mlp_dim,
            num_prefix_tokens=arch.pooled_prefix_tokens,
            activation=arch.activation,
            layer_norm_epsilon=arch.layer_norm_epsilon,
            dtype=dtype,
            name="pooling",
        )
    return TokenPooling(arch.pooling, arch.pooled_prefix_tokens, dtype=dtype, name="pooling")


def _head(tokens, arch, dtype):
    """Pooling, the final LayerNorm (on every token before the pooling, timm's `norm`, or on the
    pooled vector, timm's `fc_norm`; none with `final_norm=False`), the optional pre-logits layer
    and the classifier (or the pooled embedding with `include_top=False`)."""
    norm = _layer_norm(arch, dtype, "norm") if arch.final_norm else (lambda x: x)
    pooling = _pooling(arch, dtype)
    # A "token" pooling takes the LayerNorm of one token: the same as of all, for less work.
    after = arch.norm_after_pooling or arch.pooling == "token"
    x = norm(pooling(tokens)) if after else pooling(norm(tokens))
    if arch.representation_size is not None:
        x = keras.layers.Dense(
            arch.representation_size,
            activation="tanh",
            kernel_initializer=weight_initializer(),
            dtype=dtype,
            name="pre_logits",
        )(x)
    if not arch.include_top:
        return x
    if arch.distillation_token:
        distilled = norm(TokenPooling("distillation", dtype=dtype, name="distillation_pooling")(tokens))
        return _distilled_heads(x, distilled, arch.num_classes, arch.classifier_activation)
    # float32 logits even under mixed precision, for a stable loss.
    return keras.layers.Dense(
        arch.num_classes,
        activation=arch.classifier_activation,
        kernel_initializer=weight_initializer(),
        dtype="float32",
        name="head",
    )(x)


def resize_model(model, image_size):
    """Returns a copy of `model` for another image size, with the same weights.

    The position embeddings are resampled to the new patch grid (bicubic,
    [cls] kept), so a model trained at 224 runs or fine-tunes at 384; relative position bias
    tables are resized as timm's `set_input_size` resizes them (an MLP bias fits any grid).
    """
    config = model.get_config()
    config["image_size"] = list(pair(image_size, "image_size"))
    resized = ViT.from_config(config)
    old_grid = model.get_layer("patch_encoder").grid_size
    new_grid = resized.get_layer("patch_encoder").grid_size
    for source, target in zip(model.layers, resized.layers, strict=True):
        for source_weight, target_weight in zip(source.weights, target.weights, strict=True):
            value = keras.ops.convert_to_numpy(source_weight)
            if isinstance(source, PatchEncoder) and source_weight is source.position_embedding:
                value = resample_position_embeddings(
                    value,
                    new_grid,
                    old_grid,
                    num_prefix_tokens=source.position_prefix_tokens,
                    interpolation=model.architecture.position_embedding_interpolation,
                )
            elif source_weight.path.endswith("relative_position_bias_table"):
                extra = value.shape[0] - (2 * old_grid[0] - 1) * (2 * old_grid[1] - 1)
                value = resize_bias_table(value, new_grid, old_grid, extra_entries=extra)
            target_weight.assign(value)
    return resized
