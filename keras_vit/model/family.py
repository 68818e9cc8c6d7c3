"""What a model family tells the rest of keras-vit.

Each family is a folder of `keras_vit/model/` (`vit/`, `swin/`) whose `__init__` defines
`FAMILY`, an instance of a `Family` subclass. The registry (`keras_vit.model.registry`) finds
the family of a name or of a model, and everything above the model room asks the family what
it needs (layer groups for layer decay, weights without decay, quantisation op groups, feature
maps, checkpoint keys) instead of testing a model's class or matching its layer names.

A family's `__init__` imports no Keras: `keras-vit models` lists and counts every family's
configs without loading TensorFlow. The model class and the checkpoint mapping are imported
when first asked for.
"""

import dataclasses
import difflib
import importlib

# LayerNorm's ops, by the names Keras gives them in a converted model (norm, norm1, norm2, ...).
_LAYER_NORM = r"/norm\d?(_\d+)?/"
# The quantisation op groups every transformer family has, by its layers' names: attention,
# MLP, LayerNorm (two groups: its statistics, whose values span many orders of magnitude, and
# the normalisation that applies them), GELU and the head. A family adds its own.
TRANSFORMER_QUANTIZATION_GROUPS = {
    "QKV and out projections": ((r"/attention(_\d+)?/", "FULLY_CONNECTED"),),
    "MLP projections": ((r"/fc([12]|1_[gx])(_\d+)?/", "FULLY_CONNECTED"),),  # SwiGLU's fc1_g and fc1_x too
    "attention matmuls": ((r"/attention(_\d+)?/", "BATCH_MATMUL"),),
    "softmax": ((r"/attention(_\d+)?/", "SOFTMAX"),),
    "LayerNorm statistics": (
        (_LAYER_NORM + r"(moments/(SquaredDifference|variance)|add|Rsqrt|mul)(;|$)", "*"),
    ),
    "LayerNorm normalisation": ((_LAYER_NORM + r"(moments/mean|mul_\d+|add_\d+)(;|$)", "*"),),
    "GELU": ((".*", "GELU"),),
    "head": ((r"/head(_\d+)?/", "FULLY_CONNECTED"), (r"^StatefulPartitionedCall", "SOFTMAX")),
}
# Norms and biases: timm's 1-d rule, no weight decay in any family.
ONE_D_WEIGHTS = ("gamma", "beta", "bias")
# Where LoRA goes in a transformer block: the Dense layers of its attention (the default) and of
# its MLP (fc1, or a SwiGLU's gate and value `fc1_g` and `fc1_x`), by their paths inside the
# block; a block adapts those it has.
TRANSFORMER_LORA_TARGETS = {
    "attention": ("attention/qkv", "attention/proj"),
    "mlp": ("fc1", "fc1_g", "fc1_x", "fc2"),
}
# How `--strategy model-parallel` shards a transformer block's kernels over the mesh's "model"
# axis (Megatron's split: QKV and fc1 by output column, the attention output and fc2 by input
# row), by variable path. Every weight no pattern matches (norms, biases, tokens) is replicated.
TRANSFORMER_LAYOUT = {
    r".*/attention/qkv/kernel": (None, "model"),
    r".*/attention/proj/kernel": ("model", None),
    r".*/fc1/kernel": (None, "model"),
    r".*/fc1_[gx]/kernel": (None, "model"),  # a SwiGLU's gate and value, as fc1
    r".*/fc2/kernel": ("model", None),
    "head/kernel": ("model", None),  # by input row: any class count shards
}


class Family:
    """A model family. Subclasses set the class attributes and implement the methods."""

    # The family's name, also the `family` attribute of its models ("vit").
    name = None
    # `{config name: {argument: value, ..., "description": str}}`: the named configs.
    configs = {}
    # The model's arguments, a frozen dataclass that checks them (`architecture.py`), and the
    # keras-free module that counts its parameters and FLOPs from one (`complexity.py`).
    architecture_class = None
    complexity = None
    # "module:Class" of the keras.Model subclass that builds any of the family's configs.
    model_class_path = None
    # The module that maps the family's checkpoints to timm's keys (`checkpoint.py`).
    checkpoint_module = None
    # The module that computes its feature maps (`features.py`).
    features_module = None
    # The module that reads and writes its hub configs (`hub_config.py`): `TRANSFORMERS_TYPES`,
    # `timm_arguments`, `transformers_arguments`, `timm_model_args`, `timm_global_pool`,
    # `num_features`, `timm_architecture`, `nearest_architecture`.
    hub_module = None
    # Whether the model has one global attention map to roll out (`--attention`).
    has_attention_maps = False
    # Substrings of variable paths that get no weight decay (timm's `no_weight_decay` and its
    # 1-d rule).
    no_weight_decay = ()
    # `{group: ((op-name pattern, TFLite op), ...)}`: the quantisation sensitivity table's op
    # groups, by the names the family's layers give their ops in a converted model.
    quantization_groups = {}
    # The layers of the classifier's head: what `--freeze-backbone` and LoRA train in full.
    head_layers = ("head",)
    # `{target: (path of a Dense layer inside each block, ...)}`: where `keras_vit.enable_lora`
    # can put LoRA (`TRANSFORMER_LORA_TARGETS`).
    lora_targets = {}
    # `{variable-path pattern: axes}`: what `--strategy model-parallel` shards over the "model"
    # axis (a Keras `LayoutMap`; `TRANSFORMER_LAYOUT` and the family's stem).
    model_parallel_layout = {}
    # `{variant: ((ops, activations), ...)}`: what `keras-vit export --quantize` ships for the
    # variants made by quantisation recipes (`export.quantize.recipes`), read from the family's
    # sensitivity table (docs/benchmarks/int8.md). Each step gives `ops` (a group's name, or an
    # `(op-name pattern, TFLite op)` pair) `activations`: "int8", "int16", "float", "dynamic"
    # (int8 weights, activations quantised at run time) or "rotated dynamic" (the same after a
    # Hadamard rotation of the input and the kernel). Later steps win; an op no step names stays
    # in float; weights are int8 per channel. These are the ViT's, chosen on timm's ViT-Ti/16:
    # dynamic-range int8 in every projection after a rotation (its residual stream holds an
    # outlier channel), and 16-bit activations with LayerNorm's statistics in float.
    # `{variant: Dense layer names}`: the layers of each block whose input the export rotates in
    # the graph before the variant's recipe quantises them (`export.rotate.with_rotated_inputs`:
    # the rotation in float, the layer dynamic-range int8 without the recipe's own rotation).
    quantization_rotated_inputs = {}
    # `{variant: rewrite}`: a variant made from a rewritten copy of the model instead of the rules
    # above (`export.tflite.REWRITES`: "rotated stream", `export.rotated_int8`); a model the
    # rewrite does not cover gets the rules.
    quantization_rewrites = {}
    quantization_recipes = {
        "dynamic": (((".*", "FULLY_CONNECTED"), "rotated dynamic"),),
        "int8": (((".*", "FULLY_CONNECTED"), "rotated dynamic"),),
        "int16x8": (((".*", "*"), "int16"), ("LayerNorm statistics", "float")),
    }

    # --- configs ---------------------------------------------------------------------------------

    def config(self, name):
        """A named config's arguments (without its description).

        Raises:
            ValueError: the name is none of the family's; the message lists close names.
        """
        if name not in self.configs:
            raise ValueError(unknown_config(name, self.configs))
        config = dict(self.configs[name])
        config.pop("description", None)
        return config

    def columns(self, name):
        """The row `keras-vit models` shows for a config: `{"image_size": ..., ...}`."""
        raise NotImplementedError

    def arguments(self):
        """The names of the model's arguments (besides Keras' `dtype`, `name`, `trainable`)."""
        return tuple(field.name for field in dataclasses.fields(self.architecture_class))

    def architecture(self, arguments):
        """The model's arguments, checked and in normal form (what the counts read)."""
        names = self.arguments()
        return self.architecture_class(**{k: v for k, v in arguments.items() if k in names})

    def image_size_step(self, arguments):
        """Every image side must be a multiple of this (or, where `takes_partial_patches`, at
        least this): the patch size (a Swin pads what its windows do not tile)."""
        return arguments["patch_size"]

    def takes_partial_patches(self, arguments):
        """Whether an image side that is no multiple of the step works, its last pixels unread,
        as timm's `PatchEmbed` reads it (`model.layers.patch_grid`): SigLIP-So400m/14 at 384."""
        return False

    def parameter_count(self, arguments):
        return self.complexity.parameter_count(self.architecture(arguments))

    def forward_flops(self, arguments):
        """FLOPs of one image's forward pass (2 per multiply-accumulate)."""
        return self.complexity.forward_flops(self.architecture(arguments))

    # --- models ----------------------------------------------------------------------------------

    def model_class(self):
        module, _, name = self.model_class_path.partition(":")
        return getattr(importlib.import_module(module), name)

    def build(self, **arguments):
        return self.model_class()(**arguments)

    def checkpoint(self):
        """The checkpoint mapping module: `canonical(state, source)`, `targets(model, state)`,
        `optional_layers(model)`, `without_unplaced(model, state, source)`, `HEAD_PREFIXES`,
        `fit(key, value, model, source)` and `mismatch_hint(keys)`."""
        return importlib.import_module(self.checkpoint_module)

    def features(self):
        return importlib.import_module(self.features_module)

    def hub(self):
        return importlib.import_module(self.hub_module)

    def layer_groups(self, model):
        """`({layer name: group}, number of groups)`: layer-wise learning-rate decay gives group g
        of n the rate `lr * decay ** (n - g)`; layers not named (the head) keep the full rate."""
        raise NotImplementedError

    def block_names(self, arguments):
        """The names of the model's transformer blocks, from its arguments: where `--remat`
        recomputes activations and LoRA looks for its targets."""
        raise NotImplementedError

    def attention_grid(self, model):
        """(rows, columns) of the attention map, for a family that has one."""
        raise ValueError(f"A {self.name} model has no global attention map to roll out.")

    def attention_rollout(self, model):
        """A Keras model from `model`'s images to `{"probabilities", "attention"}`: the
        attention-rollout map `(n, rows, cols)`, for a family that has one."""
        raise ValueError(f"A {self.name} model has no global attention map to roll out.")

    def classifier_forward(self, model):
        """What the exports run: a callable from images to `model`'s outputs at inference, which may
        skip work the outputs do not read (`vit.classify`); `model` itself by default."""
        return model

    def distilled_heads(self, model):
        """A Keras model from `model`'s images to each head's logits `{"head", "head_dist"}`,
        sharing its layers, for a family with a distillation token."""
        raise ValueError(
            f"A {self.name} model has no distillation head: the student of --teacher is a ViT "
            "with a distillation token (e.g. deit_tiny_distilled_patch16_224)."
        )

    def resize(self, model, image_size):
        """A copy of `model` for another image size, with the same weights."""
        raise NotImplementedError


def of_model(model):
    """The family of a keras-vit model (its class's `family_spec`), or None for any other object:
    the modules below the registry (the checkpoint reader, the hub configs) ask the model."""
    return getattr(model, "family_spec", None)


def take_indices(depth, indices=None):
    """timm's `feature_take_indices`: absolute block (ViT) or stage (Swin) indices, in the order given.

    None: every block; an int n: the last n; a list: those blocks (negative counts from the end).
    """
    if indices is None:
        indices = depth
    if isinstance(indices, int):
        if not 0 < indices <= depth:
            raise ValueError(f"indices={indices} asks for the last {indices} of {depth} blocks.")
        return list(range(depth - indices, depth))
    absolute = [i + depth if i < 0 else i for i in indices]
    bad = [i for i, a in zip(indices, absolute, strict=True) if not 0 <= a < depth]
    if bad or not absolute:
        raise ValueError(f"Block indices {list(indices)} are not all in [-{depth}, {depth - 1}].")
    return absolute


def unknown_config(name, configs):
    """The message for a config name that is not in `configs`: the closest names."""
    close = difflib.get_close_matches(str(name), configs, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return (
        f"Unknown model config {name!r}.{hint} "
        f"Run `keras-vit models` or `keras_vit.list_models()` to see all names."
    )
