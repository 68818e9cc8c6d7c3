"""The weights a training run starts from: a pretrained checkpoint, or a model keras-vit trained
before (a `.keras` file or run folder: fine-tune one run's model on another dataset)."""

import os

from keras_vit.model import pretrained, registry, weights
from keras_vit.model.formats import CHECKPOINT_SUFFIXES
from keras_vit.storage.locate import locate
from keras_vit.storage.run_folder import MODEL_FILE
from keras_vit.storage.saving import load_trained_model


def load_weights(model, path):
    """Loads pretrained weights into a keras-vit model (`keras_vit.ViT`, `keras_vit.Swin`): any checkpoint
    `keras_vit.model.weights.load_weights` reads, or a keras-vit `.keras` file or run folder.
    A trained model's head is loaded only when it was trained on the same class names.

    Returns:
        The model, for chaining.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: not a checkpoint of a known format, or a Keras model that is no ViT.
        CheckpointMismatchError: the checkpoint does not fit the model; the message names the
            key and both shapes.
    """
    if _is_pretrained_name(path):
        state = _pretrained_state(path, model)
    elif not _is_trained_model(path):
        return weights.load_weights(model, path)
    else:
        state = _trained_state(path, class_names=getattr(model, "class_names", None))
    state, heads_left_out = _without_heads_of_other_classes(*state, weights.head_prefixes(model))
    return weights.load_state(model, state, source=os.fspath(path), heads_left_out=heads_left_out)


def check_source(path):
    """Refuses, in one line, what `load_weights` cannot start from: checked before a run builds
    anything, as `--teacher` is."""
    path = os.fspath(path)
    takes = (
        f"--weights takes a checkpoint ({', '.join(CHECKPOINT_SUFFIXES)}), a run (.keras or run folder) "
        f"or a pretrained name (`keras-vit models --pretrained`)"
    )
    if _is_pretrained_name(path):
        pretrained.resolve(path)  # a name of a form it knows; what it names is read as the run starts
        return
    if not os.path.exists(path):
        if pretrained.looks_like_a_name(path):
            raise ValueError(f"No file {path}, and it is no pretrained name: {pretrained.unknown_name(path)}")
        raise FileNotFoundError(f"Weights not found: {path} ({takes}).")
    try:
        kind = locate(path).kind
    except ValueError:
        kind = "folder" if os.path.isdir(path) else None
    if kind == "folder":
        raise ValueError(f"{path} is a folder without a {MODEL_FILE}: {takes}.")
    if kind is None:
        raise ValueError(f"{path} is not a checkpoint keras-vit reads: {takes}.")
    if kind not in ("keras", "checkpoint"):
        raise ValueError(
            f"{path} is an exported model ({kind}), whose weights cannot be trained on: {takes}."
        )


def _is_pretrained_name(path):
    return not os.path.exists(path) and pretrained.is_pretrained_name(path)


def _pretrained_state(name, model):
    """(a pretrained model's weights as a state dict, whether its head is for other classes than
    the run's: a head of the same size would mean nothing)."""
    source = pretrained.resolve(name)
    found = registry.read_hub_model(source)
    state = weights.canonical_state(model, weights.read_checkpoint(source.weights()), source.name)
    class_names = found.class_names or pretrained.class_names_for(found.num_classes)
    return state, list(class_names or []) != list(getattr(model, "class_names", None) or [])


def _without_heads_of_other_classes(state, other_classes, heads):
    """(`state` without its `heads` (timm prefixes) when they are for other classes, `{head:
    outputs}` of those left out, for the message that says so)."""
    if not other_classes:
        return state, {}
    left_out = {head: state[f"{head}.weight"].shape[0] for head in heads if f"{head}.weight" in state}
    return {k: v for k, v in state.items() if not k.startswith(tuple(f"{h}." for h in heads))}, left_out


def _is_trained_model(path):
    """Whether `path` is a keras-vit `.keras` file or run folder (else a checkpoint file)."""
    try:
        return locate(path).kind == "keras"
    except (FileNotFoundError, ValueError):
        return False


def _trained_state(path, class_names):
    """(a keras-vit `.keras` file or run folder as a state dict, whether it was trained on other
    classes than `class_names`)."""
    source = load_trained_model(path)
    try:
        state = weights.state_dict(source)
    except TypeError:
        raise ValueError(f"{path} is a Keras model but not a keras-vit model: no weights to use.") from None
    source_classes = getattr(source, "class_names", None)
    return state, bool(class_names and source_classes and list(source_classes) != list(class_names))
