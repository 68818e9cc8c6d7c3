"""The Eva model (timm's `Eva`: EVA-01, EVA02, DINOv3, the Perception Encoder, ROPE-ViT, timm's
rope-reg ViTs, LingBot, Sapiens2): any configuration, built as a functional Keras model."""

import keras

from keras_vit.model.eva import FAMILY
from keras_vit.model.eva.architecture import Architecture
from keras_vit.model.eva.layers import EvaBlock, EvaPatchEmbed, RotaryEmbedding, norm_layer
from keras_vit.model.family_model import FamilyModel, normalized, set_signature
from keras_vit.model.layers import weight_initializer
from keras_vit.model.vit.layers import AttentionPoolLatent, TokenPooling

# timm's `global_pool` as the ViT family's `TokenPooling` modes ("map" is `AttentionPoolLatent`).
_TOKEN_POOLING = {"avg": "gap", "token": "token", "": "none"}


@keras.saving.register_keras_serializable(package="keras_vit")
class Eva(FamilyModel):
    """A ViT with rotary positions, weight-compatible with timm's `Eva` (`timm/models/eva.py`).

    Takes `(batch, height, width, channels)` float images and returns class logits (or the
    pooled embedding with `include_top=False`). With `image_mean` and `image_std` the images are
    pixel values in [0, 255] and the model normalises them itself.

    Layers are named `patch_embed`, `rope` (when the model has a rotary embedding), `norm_pre`,
    `block_{i}`, `norm`, `pooling`, `fc_norm` and `head`, after timm's modules.

    Args: timm's `Eva` arguments under timm's names (`keras_vit.model.eva.architecture`), and
        keras-vit's own: `image_size`, `channels`, `include_top`, `dropout` (timm's `drop_rate`
        and `proj_drop_rate`), `attention_dropout`, `drop_path_rate`, `norm` ("layernorm" or
        "rmsnorm") with `layer_norm_epsilon`, `classifier_activation`, `image_mean`,
        `image_std`, `class_names`, `license`, `crop_pct`, `crop_mode`, `interpolation` (as
        `keras_vit.ViT`'s). The rotary embedding is computed for `image_size`'s grid: another
        size recomputes it, as timm's `set_input_size` does. timm's train-time rotary
        augmentations (`rope_shift_coords`, `rope_jitter_coords`, `rope_rescale_coords`) move
        the positions in training only, as in timm.
    """

    family_spec = FAMILY  # what the rest of keras-vit asks about the model
    family = FAMILY.name
    architecture_class = Architecture

    def __init__(self, dtype=None, **arguments):
        arch, dtype, images, keras_arguments = self._prologue(dtype, arguments)
        tokens = EvaPatchEmbed(
            arch.patch_size,
            arch.embed_dim,
            class_token=arch.class_token,
            num_reg_tokens=arch.num_reg_tokens,
            use_abs_pos_emb=arch.use_abs_pos_emb,
            no_embed_class=arch.no_embed_class,
            projection_bias=not arch.use_pre_transformer_norm,
            dtype=dtype,
            name="patch_embed",
        )(normalized(images, arch, dtype))
        rope = _rope(arch, dtype)(tokens) if arch.use_rot_pos_emb else None
        if arch.use_pre_transformer_norm:
            tokens = _norm(arch, dtype, "norm_pre")(tokens)
        for i in range(arch.depth):
            tokens = _block(arch, dtype, i)(tokens, rope=rope)
        outputs = _head(tokens, arch, dtype)
        self._epilogue(images, outputs, arch, dtype, keras_arguments)

    @property
    def blocks(self):
        return [self.get_layer(f"block_{i}") for i in range(self.depth)]


set_signature(Eva)


def _norm(arch, dtype, name):
    return norm_layer(arch.norm, arch.layer_norm_epsilon, name, dtype)


def _rope(arch, dtype):
    return RotaryEmbedding(
        arch.rope_type,
        arch.grid,
        arch.head_dim,
        num_heads=arch.num_heads,
        depth=arch.depth,
        temperature=arch.rope_temperature,
        grid_offset=arch.rope_grid_offset,
        grid_indexing=arch.rope_grid_indexing,
        rotate_half=arch.rope_rotate_half,
        ref_feat_shape=arch.ref_feat_shape if arch.rope_type == "cat" else None,
        shift_coords=arch.rope_shift_coords,
        jitter_coords=arch.rope_jitter_coords,
        rescale_coords=arch.rope_rescale_coords,
        dtype=dtype,
        name="rope",
    )


def _block(arch, dtype, i):
    return EvaBlock(
        arch.embed_dim,
        arch.num_heads,
        arch.mlp_hidden,
        mlp_kind=arch.mlp_kind,
        scale_mlp=arch.scale_mlp,
        init_values=arch.init_values,
        attn_only_layer_scale=arch.attn_only_layer_scale,
        post_norm=arch.use_post_norm,
        rope_index=i if arch.use_rot_pos_emb and arch.rope_type == "mixed" else None,
        attention=dict(
            num_kv_heads=arch.kv_heads(i),
            qkv_bias=arch.qkv_bias,
            qkv_fused=arch.qkv_fused,
            attn_type=arch.attn_type,
            qk_norm=arch.qk_norm,
            scale_norm=arch.scale_attn_inner,
            rotate_half=arch.rope_rotate_half,
            num_prefix_tokens=arch.prefix_tokens,
            attention_dropout=arch.attention_dropout,
        ),
        norm=arch.norm,
        layer_norm_epsilon=arch.layer_norm_epsilon,
        dropout=arch.dropout,
        drop_path_rate=arch.drop_path_rate * i / max(arch.depth - 1, 1),
        dtype=dtype,
        name=f"block_{i}",
    )


def _head(tokens, arch, dtype):
    """timm's `norm`, the pooling (`global_pool`), `fc_norm` and the classifier."""
    if arch.final_norm:
        tokens = _norm(arch, dtype, "norm")(tokens)
    if arch.global_pool == "map":
        pooling = AttentionPoolLatent(
            arch.embed_dim,
            arch.attn_pool_num_heads or arch.num_heads,
            int(arch.embed_dim * (arch.attn_pool_mlp_ratio or arch.mlp_ratio)),
            num_prefix_tokens=0,  # timm's pool attends over every token, [cls] included
            layer_norm_epsilon=arch.layer_norm_epsilon,
            dtype=dtype,
            name="pooling",
        )
    else:
        pooling = TokenPooling(
            _TOKEN_POOLING[arch.global_pool], arch.prefix_tokens, dtype=dtype, name="pooling"
        )
    x = pooling(tokens)
    if arch.fc_norm:
        x = _norm(arch, dtype, "fc_norm")(x)
    if not arch.include_top:
        return x
    x = keras.layers.Dropout(arch.dropout, dtype=dtype, name="head_dropout")(x)
    return keras.layers.Dense(
        arch.num_classes,
        activation=arch.classifier_activation,
        kernel_initializer=weight_initializer(),
        dtype="float32",
        name="head",
    )(x)


def resize_model(model, image_size):
    """A copy of an Eva for another image size, with the same weights: the rotary tables
    recomputed for the new grid, absolute position embeddings resampled (bicubic, as timm)."""
    from keras_vit.model.weights import load_state, state_dict

    config = model.get_config()
    config["image_size"] = [image_size, image_size] if isinstance(image_size, int) else list(image_size)
    return load_state(Eva.from_config(config), state_dict(model), source=f"{model.name} resized")
