"""An Eva's arguments: their defaults, checks and normal form, in one place.

`keras_vit.Eva` takes exactly these, besides Keras' own `dtype`, `name` and `trainable`. They are
timm's `Eva` arguments under timm's names (`timm/models/eva.py`), so that a timm entry point's
keyword arguments and a repo's `model_args` read as they are; `complexity.py` counts parameters
and FLOPs from them without Keras.
"""

import dataclasses

from keras_vit.model.checks import check_positive_int, check_rate, pair
from keras_vit.model.transform import DEFAULT as DEFAULT_TRANSFORM
from keras_vit.model.transform import Transform

# timm's `global_pool`: the mean of the patch tokens, the [cls] token, attention pooling (PE's),
# or every token kept.
POOLINGS = ("avg", "token", "map", "")
# The rotary embedding's kind (timm's `rope_type`): EVA02's axial `RotaryEmbeddingCat`, ROPE-ViT's
# `RotaryEmbeddingMixed` (learned frequencies per block and head), DINOv3's `RotaryEmbeddingDinoV3`.
ROPE_TYPES = ("cat", "mixed", "dinov3")
# The attention (timm's `attn_type`): `EvaAttention` (a query and value bias, no key bias) or
# `AttentionRope` (a bias on all three).
ATTENTION_TYPES = ("eva", "rope")
NORMS = ("layernorm", "rmsnorm")


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The arguments of `keras_vit.Eva` (documented there), checked and in normal form."""

    image_size: tuple = (224, 224)
    patch_size: int = 16
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    # Key/value heads per block (grouped-query attention, Sapiens2's); None: num_heads in each.
    num_kv_heads: tuple | None = None
    num_classes: int = 1000
    channels: int = 3
    global_pool: str = "avg"
    include_top: bool = True
    qkv_bias: bool = True
    qkv_fused: bool = True
    qk_norm: bool = False
    mlp_ratio: float = 4.0
    swiglu_mlp: bool = False
    swiglu_align_to: int = 0
    scale_mlp: bool = False
    scale_attn_inner: bool = False
    attn_type: str = "eva"
    dropout: float = 0.0
    attention_dropout: float = 0.0
    drop_path_rate: float = 0.0
    norm: str = "layernorm"
    layer_norm_epsilon: float = 1e-6
    init_values: float | None = None
    attn_only_layer_scale: bool = False
    class_token: bool = True
    num_reg_tokens: int = 0
    no_embed_class: bool = False
    use_abs_pos_emb: bool = True
    use_rot_pos_emb: bool = False
    rope_type: str = "cat"
    rope_grid_offset: float = 0.0
    rope_grid_indexing: str = "ij"
    rope_temperature: float = 10000.0
    rope_rotate_half: bool = False
    ref_feat_shape: tuple | None = None
    # timm's train-time rotary augmentations (none at inference): shift, per-axis jitter, rescale.
    rope_shift_coords: float | None = None
    rope_jitter_coords: float | None = None
    rope_rescale_coords: float | None = None
    use_post_norm: bool = False
    use_pre_transformer_norm: bool = False
    use_post_transformer_norm: bool | None = None
    use_fc_norm: bool | None = None
    attn_pool_num_heads: int | None = None
    attn_pool_mlp_ratio: float | None = None
    classifier_activation: str | None = None
    image_mean: list | None = None
    image_std: list | None = None
    class_names: list | None = None
    license: str | None = None
    crop_pct: float = DEFAULT_TRANSFORM.crop_pct
    crop_mode: str = DEFAULT_TRANSFORM.crop_mode
    interpolation: str = DEFAULT_TRANSFORM.interpolation

    def __post_init__(self):
        self._normalise()
        self._check()

    def _normalise(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        put("image_size", pair(self.image_size, "image_size"))
        if self.ref_feat_shape is not None:
            put("ref_feat_shape", pair(self.ref_feat_shape, "ref_feat_shape"))
        if isinstance(self.num_kv_heads, int):
            put("num_kv_heads", (self.num_kv_heads,) * self.depth)
        if self.num_kv_heads is not None:
            kv = tuple(int(h) if h is not None else self.num_heads for h in self.num_kv_heads)
            put("num_kv_heads", None if all(h == self.num_heads for h in kv) else kv)
        for name in ("image_mean", "image_std"):
            if getattr(self, name) is not None:
                put(name, [float(value) for value in getattr(self, name)])
        if self.class_names is not None:
            put("class_names", [str(name) for name in self.class_names])
        for name in ("mlp_ratio", "layer_norm_epsilon", "rope_grid_offset", "rope_temperature"):
            put(name, float(getattr(self, name)))
        if self.init_values is not None:
            put("init_values", float(self.init_values))
        put("crop_pct", Transform.of(self).crop_pct)

    def _check(self):
        for name in ("patch_size", "embed_dim", "depth", "num_heads", "channels", "num_classes"):
            check_positive_int(getattr(self, name), name)
        check_rate(self.drop_path_rate, "drop_path_rate")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide embed_dim={self.embed_dim}.")
        for name, choices in (
            ("global_pool", POOLINGS),
            ("rope_type", ROPE_TYPES),
            ("attn_type", ATTENTION_TYPES),
            ("norm", NORMS),
            ("rope_grid_indexing", ("ij", "xy")),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}.")
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' takes the [cls] token: set class_token=True.")
        if (self.image_mean is None) != (self.image_std is None):
            raise ValueError("Set both image_mean and image_std, or neither.")
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class_names given for num_classes={self.num_classes}.")
        if self.use_rot_pos_emb and self.head_dim % 4:
            raise ValueError(f"A rotary embedding needs a head width divisible by 4, not {self.head_dim}.")
        for name, least in (("rope_shift_coords", 0), ("rope_jitter_coords", 1), ("rope_rescale_coords", 1)):
            if getattr(self, name) is not None and not float(getattr(self, name)) >= least:
                raise ValueError(f"{name} must be at least {least}, got {getattr(self, name)!r}.")
        if self.use_rot_pos_emb and self.rope_type == "mixed" and self.rope_rotate_half:
            raise ValueError("rope_type='mixed' rotates interleaved pairs: rope_rotate_half=False.")
        if self.num_kv_heads is not None:
            if len(self.num_kv_heads) != self.depth or any(self.num_heads % h for h in self.num_kv_heads):
                raise ValueError(f"num_kv_heads {self.num_kv_heads}: one per block, each dividing num_heads.")
            if self.qkv_fused or self.attn_type != "rope":
                raise ValueError(
                    "Grouped-query attention (num_kv_heads) needs qkv_fused=False, attn_type='rope'."
                )
        if self.use_post_norm and (self.qk_norm or self.attn_only_layer_scale or self.num_kv_heads):
            raise ValueError(
                "use_post_norm takes no qk_norm, num_kv_heads or attn_only_layer_scale (as timm)."
            )

    # --- what derives from the arguments, as timm derives it ---

    @property
    def head_dim(self):
        return self.embed_dim // self.num_heads

    @property
    def grid(self):
        return (self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size)

    @property
    def num_patches(self):
        return self.grid[0] * self.grid[1]

    @property
    def prefix_tokens(self):
        return int(self.class_token) + self.num_reg_tokens

    @property
    def fc_norm(self):
        """timm's `fc_norm`: a norm on the pooled vector (by default after an "avg" pooling)."""
        return self.global_pool == "avg" if self.use_fc_norm is None else self.use_fc_norm

    @property
    def final_norm(self):
        """timm's `norm` after the blocks: by default wherever there is no `fc_norm`."""
        return not self.fc_norm if self.use_post_transformer_norm is None else self.use_post_transformer_norm

    @property
    def mlp_hidden(self):
        """The MLP's hidden width (SwiGLU's, aligned as timm aligns it)."""
        hidden = int(self.embed_dim * self.mlp_ratio)
        if self.swiglu_mlp and self.swiglu_align_to:
            hidden += -hidden % self.swiglu_align_to
        return hidden

    @property
    def mlp_kind(self):
        """timm's MLP of the block: "swiglu" (separate gate and value, when normed or aligned),
        "glu" (packed, `GluMlp`, gate first) or "mlp" (GELU)."""
        if not self.swiglu_mlp:
            return "mlp"
        return "swiglu" if self.scale_mlp or self.swiglu_align_to else "glu"

    def kv_heads(self, block):
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads[block]

    def config(self):
        config = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        config["image_size"] = list(self.image_size)
        for name in ("ref_feat_shape", "num_kv_heads"):
            if config[name] is not None:
                config[name] = list(config[name])
        return config


ARGUMENTS = tuple(field.name for field in dataclasses.fields(Architecture))
