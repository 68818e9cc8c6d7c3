"""LoRA fine-tuning with Keras' own low-rank adapters (`Dense.enable_lora`).

`enable_lora(model, rank, targets)` puts adapters on the Dense layers the model's family names
for each target in every block (`Family.lora_targets`: the attention's QKV and output by
default, the MLP on request), freezes the rest of the backbone and leaves the head trainable.

A LoRA model saves merged: Keras' `Dense.save_own_variables` writes `kernel + B·A·alpha/rank`,
so the run folder's `model.keras` is a plain model that exports, predicts and loads anywhere.
A backup must resume the adapters themselves instead: `adapters_kept(model)` makes the LoRA
layers save and load their frozen kernel and both adapters while a backup is written or read.
"""

import contextlib

from keras_vit.model import registry

# What `--lora-rank` adapts unless `--lora-targets` says otherwise.
DEFAULT_TARGETS = ("attention",)


def enable_lora(model, rank, targets=DEFAULT_TARGETS, alpha=None):
    """Adds rank-`rank` adapters to `model`'s `targets` (of its family's `lora_targets`), freezes
    every other backbone weight (biases too) and keeps the head trainable; returns `model`.

    Raises:
        ValueError: a rank below 1, a target the family has not, or LoRA already enabled.
    """
    family = registry.family_of(model)
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"The LoRA rank must be a whole number of at least 1, got {rank!r}.")
    layers = lora_layers(model, targets)
    if any(layer.lora_enabled for layer in layers):
        raise ValueError("LoRA is already enabled on this model.")
    head = {
        id(v) for name in family.head_layers if _has_layer(model, name) for v in model.get_layer(name).weights
    }
    for variable in model.weights:
        if id(variable) not in head:
            variable.trainable = False
    for layer in layers:
        layer.enable_lora(rank, lora_alpha=alpha)  # its adapters are the only trainable weights
    return model


def lora_layers(model, targets):
    """The Dense layers of every block that `targets` name, in block order."""
    family = registry.family_of(model)
    check_targets(family, targets)
    # Each path once: two targets may share a fused layer (a parallel block's `in_proj`).
    paths = list(dict.fromkeys(path for target in targets for path in family.lora_targets[target]))
    blocks = [model.get_layer(name) for name in family.block_names(model.get_config())]
    # A family's block may lack a path (an Eva's fused `qkv` or separate `q_proj`, `k_proj`, `v_proj`).
    return [_sublayer(block, path) for block in blocks for path in paths if _has_sublayer(block, path)]


def check_targets(family, targets):
    """Refuses `targets` that `family` has no LoRA target for, or none."""
    unknown = sorted(set(targets) - set(family.lora_targets))
    if unknown or not targets:
        raise ValueError(
            f"Unknown LoRA target {', '.join(unknown) or '(none given)'} for a {family.name} model; "
            f"targets: {', '.join(family.lora_targets)}."
        )


def lora_enabled(model):
    return any(getattr(layer, "lora_enabled", False) for layer in model._flatten_layers())


@contextlib.contextmanager
def adapters_kept(model):
    """While open, `model`'s LoRA layers save and load their frozen kernel, bias and both
    adapters as they are (Keras saves them merged and zeroes the adapters on load, which would
    resume a run with dead adapters and mismatched optimizer moments)."""
    layers = [layer for layer in model._flatten_layers() if getattr(layer, "lora_enabled", False)]
    for layer in layers:
        layer.save_own_variables = _raw_save.__get__(layer)
        layer.load_own_variables = _raw_load.__get__(layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.save_own_variables, layer.load_own_variables


def _raw_variables(layer):
    return [v for v in (layer._kernel, layer.bias, layer.lora_kernel_a, layer.lora_kernel_b) if v is not None]


def _raw_save(layer, store):
    for index, variable in enumerate(_raw_variables(layer)):
        store[str(index)] = variable


def _raw_load(layer, store):
    variables = _raw_variables(layer)
    if len(store.keys()) != len(variables):
        raise ValueError(
            f"{layer.path}: the backup holds {len(store.keys())} arrays, LoRA needs {len(variables)}."
        )
    for index, variable in enumerate(variables):
        variable.assign(store[str(index)])


def _sublayer(layer, path):
    for name in path.split("/"):
        layer = next(
            child
            for child in layer._flatten_layers(include_self=False, recursive=False)
            if child.name == name
        )
    return layer


def _has_sublayer(layer, path):
    try:
        _sublayer(layer, path)
    except StopIteration:
        return False
    return True


def _has_layer(model, name):
    return any(layer.name == name for layer in model.layers)
