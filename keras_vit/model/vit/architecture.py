"""A ViT's arguments: their defaults, checks and normal form, in one place.

`keras_vit.ViT` takes exactly these, besides Keras' own `dtype`, `name` and `trainable`, and
documents them. `keras_vit.model.complexity` counts parameters and FLOPs from them without
Keras, so `keras-vit models` answers at once.
"""

import dataclasses
import math

from keras_vit.model.checks import check_positive_int, check_rate, pair
from keras_vit.model.transform import DEFAULT as DEFAULT_TRANSFORM
from keras_vit.model.transform import Transform

# The pooling of the tokens into one vector (timm's `global_pool`: "token", "avg", "map", "").
POOLINGS = ("token", "gap", "map", "none")
# The MLP's activation (timm's `act_layer`) and kind (timm's `mlp_layer`: Mlp, SwiGLU, SwiGLUPacked).
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
MLPS = ("mlp", "swiglu", "swiglu_packed")
# The norm of the blocks, the final norm and the patch embedding's (timm's `norm_layer`,
# `embed_norm_layer`): LayerNorm or RmsNorm (AIMv2's).
NORMS = ("layernorm", "rmsnorm")
# The block (timm's `block_fn`): pre-norm (`Block`, `RelPosBlock`), post-norm (`ResPostBlock`,
# `ResPostRelPosBlock`) or attention and MLP in parallel (`ParallelScalingBlock`).
BLOCKS = ("pre_norm", "res_post", "parallel")
# The attention (timm's `attn_layer`): softmax attention, or differential attention ("diff").
ATTENTIONS = ("standard", "diff")
# The relative position bias in place of absolute position embeddings (timm's `rel_pos_type` of
# `VisionTransformerRelPos`): none, `RelPosMlp` or `RelPosBias`.
POSITION_BIASES = (None, "mlp", "table")
# The stem before the patch projection (timm's `HybridEmbed` backbone): none (the pixels),
# timm's ResNetV2 of the hybrid ViTs or MobileCLIP's `ConvStem` (`keras_vit.model.vit.stems`).
STEMS = (None, "resnetv2", "convstem")
# How position embeddings are resampled to another grid: timm's antialiased bicubic, or, as timm
# loads FlexiViT's and RADIO's, bilinear (RADIO-B/H v3: with aligned corners), or as transformers'
# DINOv2, SigLIP and CLIP resample theirs, bicubic without antialiasing.
INTERPOLATIONS = ("bicubic", "bilinear", "bilinear_aligned", "bicubic_no_antialias")
# MobileCLIP's ConvStem: kernel = stride of its three convolutions.
CONVSTEM_STRIDES = (4, 2, 2)
# timm's ResNetV2 stage widths (a bottleneck's output; its middle is a quarter of it) and stem.
RESNETV2_CHANNELS = (256, 512, 1024, 2048)
RESNETV2_STEM_CHANNELS = 64


def resnetv2_feature_size(image_size, depths):
    """(rows, cols) of a ResNetV2 stem's feature map for an image of `image_size`: the stem's
    strided convolution and max pooling, then each stage after the first, each halving a side,
    rounding up ("same" padding)."""
    size = list(image_size)
    for _ in range(2 + max(len(depths) - 1, 0)):
        size = [math.ceil(side / 2) for side in size]
    return tuple(size)


def resnetv2_channels(depths):
    """A ResNetV2 stem's output channels: the stem's, or the last stage's."""
    return RESNETV2_CHANNELS[len(depths) - 1] if depths else RESNETV2_STEM_CHANNELS


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The arguments of `keras_vit.ViT` (documented there), checked and in normal form."""

    image_size: tuple = (224, 224)
    patch_size: int = 16
    hidden_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    num_classes: int = 1000
    channels: int = 3
    pooling: str = "token"
    representation_size: int | None = None
    include_top: bool = True
    dropout: float = 0.0
    attention_dropout: float = 0.0
    drop_path_rate: float = 0.0
    layer_norm_epsilon: float = 1e-6
    # The kind of every norm (its epsilon is layer_norm_epsilon), and whether the patch embedding
    # ends in one, before the position embeddings (timm's `embed_norm_layer`, AIMv2's).
    norm: str = "layernorm"
    embed_norm: bool = False
    classifier_activation: str | None = None
    image_mean: list | None = None
    image_std: list | None = None
    class_names: list | None = None
    # The weights' licence, as timm's pretrained_cfg names it ("apache-2.0"): carried, never read.
    license: str | None = None
    layer_scale: float | None = None
    cls_position_embedding: bool = True
    distillation_token: bool = False
    class_token: bool = True
    register_tokens: int = 0
    norm_before_pooling: bool | None = None
    # Whether the pooling reads the prefix tokens too (timm's `pool_include_prefix`: test_vit3's).
    pool_include_prefix: bool = False
    qkv_bias: bool = True
    proj_bias: bool = True
    pre_norm: bool = False
    final_norm: bool = True
    activation: str = "gelu"
    mlp: str = "mlp"
    block: str = "pre_norm"
    attention: str = "standard"
    scale_attention_norm: bool = False
    scale_mlp_norm: bool = False
    position_bias: str | None = None
    position_bias_dim: int = 128
    shared_position_bias: bool = False
    stem: str | None = None
    stem_depths: tuple = ()
    # How checkpoints' position embeddings are resampled to another grid (timm's by architecture).
    position_embedding_interpolation: str = "bicubic"
    # How images are brought to image_size at evaluation (keras_vit.model.transform).
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
        put("stem_depths", tuple(int(depth) for depth in self.stem_depths))
        for name in ("image_mean", "image_std"):
            if getattr(self, name) is not None:
                put(name, [float(value) for value in getattr(self, name)])
        if self.class_names is not None:
            put("class_names", [str(name) for name in self.class_names])
        if self.layer_scale is not None:
            put("layer_scale", float(self.layer_scale))
        for name in (
            "cls_position_embedding",
            "distillation_token",
            "class_token",
            "qkv_bias",
            "proj_bias",
            "pre_norm",
            "final_norm",
            "shared_position_bias",
            "scale_attention_norm",
            "scale_mlp_norm",
            "embed_norm",
            "pool_include_prefix",
        ):
            put(name, bool(getattr(self, name)))
        if self.norm_before_pooling is not None:
            put("norm_before_pooling", bool(self.norm_before_pooling))
        put("crop_pct", Transform.of(self).crop_pct)  # checked, as a float

    def _check(self):
        for name in ("patch_size", "depth", "channels", "num_classes"):
            check_positive_int(getattr(self, name), name)
        if self.representation_size is not None:
            check_positive_int(self.representation_size, "representation_size")
        check_rate(self.drop_path_rate, "drop_path_rate")
        if (self.image_mean is None) != (self.image_std is None):
            raise ValueError("Set both image_mean and image_std, or neither.")
        if self.image_mean is not None and not (len(self.image_mean) == len(self.image_std) == self.channels):
            raise ValueError(
                f"image_mean and image_std need {self.channels} values (one per channel), "
                f"got {self.image_mean} and {self.image_std}."
            )
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class_names given for num_classes={self.num_classes}.")
        check_positive_int(self.position_bias_dim, "position_bias_dim")
        for name, choices in (
            ("pooling", POOLINGS),
            ("activation", ACTIVATIONS),
            ("mlp", MLPS),
            ("norm", NORMS),
            ("block", BLOCKS),
            ("attention", ATTENTIONS),
            ("position_bias", POSITION_BIASES),
            ("stem", STEMS),
            ("position_embedding_interpolation", INTERPOLATIONS),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"{name} must be one of {', '.join(map(repr, choices))}, got {getattr(self, name)!r}."
                )
        if self.mlp == "swiglu_packed" and self.mlp_dim % 2:
            raise ValueError(
                f"mlp='swiglu_packed' halves fc1's {self.mlp_dim} outputs: give an even mlp_dim."
            )
        if self.stem_depths and self.stem != "resnetv2":
            raise ValueError("stem_depths are a ResNetV2's stages: set stem='resnetv2' too.")
        if self.stem == "convstem" and (self.patch_size != 1 or self.hidden_dim % 4):
            raise ValueError(
                "stem='convstem' ends in the tokens' width itself: give patch_size=1 and a hidden_dim "
                f"divisible by 4, got patch_size={self.patch_size}, hidden_dim={self.hidden_dim}."
            )
        if len(self.stem_depths) > len(RESNETV2_CHANNELS) or not all(d > 0 for d in self.stem_depths):
            raise ValueError(f"stem_depths: up to 4 positive stage depths, got {list(self.stem_depths)}.")
        features = self.feature_size
        if self.stem is not None and (features[0] % self.patch_size or features[1] % self.patch_size):
            raise ValueError(
                f"The stem's {features[0]}x{features[1]} feature map is not divisible by the patch "
                f"size {self.patch_size}."
            )
        scale_norms = self.scale_attention_norm or self.scale_mlp_norm
        if self.block == "parallel" and (self.mlp != "mlp" or self.position_bias is not None or scale_norms):
            raise ValueError("block='parallel' has timm's plain MLP, and no position bias or scale norms.")
        if self.norm == "rmsnorm" and (self.block == "res_post" or scale_norms or self.pooling == "map"):
            raise ValueError(
                "norm='rmsnorm' is AIMv2's norm of pre-norm blocks: give block='pre_norm' or "
                "'parallel', no scale norms and a pooling other than 'map'."
            )
        if self.attention == "diff" and self.scale_attention_norm:
            raise ValueError("attention='diff' has no scale_attention_norm (timm's neither).")
        halves = self.hidden_dim % (2 * self.num_heads) == 0
        if self.attention == "diff" and (self.position_bias is not None or not halves):
            raise ValueError(
                "attention='diff' halves each head and takes no relative position bias: give a "
                "hidden_dim divisible by 2 x num_heads and no position_bias."
            )
        if self.shared_position_bias and self.position_bias is None:
            raise ValueError("shared_position_bias shares a relative position bias: set position_bias too.")
        if self.position_bias == "table" and self.prefix_tokens > 1:
            raise ValueError(
                f"position_bias='table' has entries for one [cls] token, "
                f"not {self.prefix_tokens} prefix tokens."
            )
        if self.pooling == "token" and not self.class_token:
            raise ValueError("pooling='token' takes the [cls] token: set class_token=True or pooling='gap'.")
        if self.distillation_token and (self.pooling != "token" or self.representation_size is not None):
            raise ValueError(
                "distillation_token needs pooling='token' and no representation_size, as DeiT has."
            )

    @property
    def prefix_tokens(self):
        """[cls], DeiT's distillation token and the registers, before the patches."""
        return int(self.class_token) + int(self.distillation_token) + self.register_tokens

    @property
    def pooled_prefix_tokens(self):
        """The prefix tokens the pooling leaves out: none with `pool_include_prefix`."""
        return 0 if self.pool_include_prefix else self.prefix_tokens

    @property
    def norm_after_pooling(self):
        """Whether the final LayerNorm acts on the pooled vector (timm's `fc_norm`) rather than on
        every token (timm's `norm`): by default after a "gap" pooling only, as timm's
        `fc_norm=None`; for "token" and "none" poolings the two are the same, and it is `norm`."""
        if self.pooling in ("token", "none"):
            return False
        return self.pooling == "gap" if self.norm_before_pooling is None else not self.norm_before_pooling

    @property
    def feature_size(self):
        """(rows, cols) of what the patch projection sees: the image, or the stem's feature map."""
        if self.stem is None:
            return self.image_size
        if self.stem == "convstem":
            return tuple(side // self.stem_reduction for side in self.image_size)
        return resnetv2_feature_size(self.image_size, self.stem_depths)

    @property
    def stem_reduction(self):
        """How many pixels a side of a feature map's cell spans: 1 without a stem."""
        if self.stem == "convstem":
            return math.prod(CONVSTEM_STRIDES)
        return 1 if self.stem is None else 2 ** (2 + max(len(self.stem_depths) - 1, 0))

    @property
    def feature_channels(self):
        """The channels the patch projection sees: the image's, or the stem's."""
        if self.stem == "convstem":
            return self.hidden_dim
        return self.channels if self.stem is None else resnetv2_channels(self.stem_depths)

    @property
    def grid_size(self):
        rows, cols = self.feature_size
        return (rows // self.patch_size, cols // self.patch_size)

    @property
    def num_patches(self):
        return self.grid_size[0] * self.grid_size[1]

    def config(self):
        """The arguments as a JSON-ready dict (`ViT.get_config`)."""
        config = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        config["image_size"] = list(self.image_size)
        config["stem_depths"] = list(self.stem_depths)
        return config


ARGUMENTS = tuple(field.name for field in dataclasses.fields(Architecture))
