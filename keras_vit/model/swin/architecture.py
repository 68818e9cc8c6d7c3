"""A Swin Transformer's arguments: their defaults, checks and normal form, in one place.

`keras_vit.Swin` takes exactly these, besides Keras' own `dtype`, `name` and `trainable`, and
documents them. Keras-free: `keras_vit.model.swin.complexity` counts from them.
"""

import dataclasses
import math

from keras_vit.model.checks import check_positive_int, check_rate, nearest_sizes, pair
from keras_vit.model.transform import DEFAULT as DEFAULT_TRANSFORM
from keras_vit.model.transform import Transform


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The arguments of `keras_vit.Swin` (documented there), checked and in normal form."""

    image_size: tuple = (224, 224)
    patch_size: int = 4
    embed_dim: int = 96
    depths: tuple = (2, 2, 6, 2)
    num_heads: tuple = (3, 6, 12, 24)
    window_size: tuple = 7  # one int for every stage, or one per stage
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    channels: int = 3
    include_top: bool = True
    dropout: float = 0.0
    attention_dropout: float = 0.0
    drop_path_rate: float = 0.0
    layer_norm_epsilon: float = 1e-5
    classifier_activation: str | None = None
    image_mean: list | None = None
    image_std: list | None = None
    class_names: list | None = None
    # The weights' licence, as timm's pretrained_cfg names it ("apache-2.0"): carried, never read.
    license: str | None = None
    crop_pct: float = DEFAULT_TRANSFORM.crop_pct
    crop_mode: str = DEFAULT_TRANSFORM.crop_mode
    interpolation: str = DEFAULT_TRANSFORM.interpolation

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        put("image_size", pair(self.image_size, "image_size"))
        put("depths", tuple(int(d) for d in self.depths))
        stages = len(self.depths)
        heads = (self.num_heads,) * stages if isinstance(self.num_heads, int) else self.num_heads
        put("num_heads", tuple(int(h) for h in heads))
        window = (self.window_size,) * stages if isinstance(self.window_size, int) else self.window_size
        put("window_size", tuple(int(w) for w in window))
        put("mlp_ratio", float(self.mlp_ratio))
        for name in ("image_mean", "image_std"):
            if getattr(self, name) is not None:
                put(name, [float(value) for value in getattr(self, name)])
        if self.class_names is not None:
            put("class_names", [str(name) for name in self.class_names])
        put("crop_pct", Transform.of(self).crop_pct)  # checked, as a float
        self._check()

    def _check(self):
        for name in ("patch_size", "embed_dim", "channels", "num_classes"):
            check_positive_int(getattr(self, name), name)
        if not self.depths:
            raise ValueError("depths needs one block count per stage, e.g. (2, 2, 6, 2).")
        for name in ("depths", "num_heads", "window_size"):
            if len(getattr(self, name)) != len(self.depths):
                raise ValueError(
                    f"{name} needs one value per stage ({len(self.depths)}), got {getattr(self, name)}."
                )
            for value in getattr(self, name):
                check_positive_int(value, name)
        for stage, (dim, heads) in enumerate(zip(self.stage_dims, self.num_heads, strict=True)):
            if dim % heads:
                raise ValueError(f"num_heads {heads} does not divide stage {stage}'s width {dim}.")
        check_rate(self.drop_path_rate, "drop_path_rate")
        for side in self.image_size:
            if side % self.patch_size:
                size = f"{self.image_size[0]}x{self.image_size[1]}"
                raise ValueError(
                    f"Image size {size} is not divisible by the patch size {self.patch_size}: "
                    f"the nearest sizes that work are {nearest_sizes(side, self.patch_size)}."
                )
        if (self.image_mean is None) != (self.image_std is None):
            raise ValueError("Set both image_mean and image_std, or neither.")
        if self.image_mean is not None and not (len(self.image_mean) == len(self.image_std) == self.channels):
            raise ValueError(f"image_mean and image_std need {self.channels} values (one per channel).")
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class_names given for num_classes={self.num_classes}.")

    @property
    def stage_dims(self):
        """Each stage's width: the embedding's, doubled by each patch merging."""
        return tuple(self.embed_dim * 2**stage for stage in range(len(self.depths)))

    @property
    def stage_grids(self):
        """Each stage's (rows, columns) of tokens: the patch grid, halved (rounded up) per stage."""
        grid = tuple(side // self.patch_size for side in self.image_size)
        grids = [grid]
        for _ in self.depths[1:]:
            grid = tuple(math.ceil(side / 2) for side in grid)
            grids.append(grid)
        return tuple(grids)

    @property
    def num_features(self):
        return self.stage_dims[-1]

    def config(self):
        """The arguments as a JSON-ready dict (`Swin.get_config`)."""
        config = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        for name in ("image_size", "depths", "num_heads", "window_size"):
            config[name] = list(config[name])
        return config


ARGUMENTS = tuple(field.name for field in dataclasses.fields(Architecture))
