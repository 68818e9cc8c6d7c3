"""Pretrained weight import and export, for every family: timm and Hugging Face state dicts,
PyTorch pickles and Google's `.npz` files.

Every format is first turned into one canonical form, timm's state dict (`keras_vit.model.state`),
by the model's family (`checkpoint.canonical`), and then assigned to the Keras model by one
function, all or nothing. Reading needs no PyTorch except for pickled `.pth` / `.bin` files.
"""

import json
import logging
import os

import keras
import numpy as np

from keras_vit.model.family import of_model
from keras_vit.model.formats import CHECKPOINT_SUFFIXES
from keras_vit.model.state import CheckpointMismatchError, linear, to_keras, to_torch

logger = logging.getLogger(__name__)

__all__ = ["CheckpointMismatchError", "load_weights", "load_state", "read_checkpoint", "state_dict"]


def load_weights(model, path):
    """Loads a pretrained checkpoint into a keras-vit model (`keras_vit.ViT`, `keras_vit.Swin`).

    Reads timm state dicts, Hugging Face transformers checkpoints (`.safetensors`, `.pth`,
    `.pt`, `.bin`; float32, float16 or bfloat16), the original Google ViT and AugReg `.npz`
    checkpoints and Microsoft's original Swin files (`keras_vit.load_weights` reads keras-vit's
    own runs too). Position embeddings (ViT) and relative-position bias tables (Swin) are
    resampled when the model's grid or window differs from the checkpoint's; the classifier is
    loaded when the class counts match and left freshly initialised otherwise.

    Args:
        model: a keras-vit model, e.g. from `keras_vit.create_model`.
        path: the checkpoint file.

    Returns:
        The model, for chaining.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: the file is not a readable checkpoint of a known format.
        CheckpointMismatchError: the checkpoint does not fit the model; the
            message names the key and both shapes.
    """
    checkpoint = _checkpoint_of(model)  # a keras-vit model, checked before the file is read
    _assign(model, checkpoint, read_checkpoint(path), source=os.fspath(path))
    return model


def load_state(model, state, source, heads_left_out=None):
    """Assigns a state dict (`read_checkpoint`, `state_dict`) to a keras-vit model, as
    `load_weights` does; `source` names it in messages, and `heads_left_out` the heads the caller
    took out of `state` for being trained on other classes (`{"head": outputs}`). Returns the model."""
    _assign(model, _checkpoint_of(model), state, source=source, heads_left_out=heads_left_out or {})
    return model


def canonical_state(model, state, source):
    """`state` in timm's keys for `model`'s family (transformers' and original layouts converted)."""
    return _checkpoint_of(model).canonical(state, source)


def head_prefixes(model):
    """The timm prefixes of `model`'s family's classifier heads (`head`, `head.fc`, ...)."""
    return _checkpoint_of(model).HEAD_PREFIXES


def read_checkpoint(path):
    """Reads a checkpoint file into a state dict of NumPy float32 arrays, in the file's own keys
    (the model's family turns them into timm's)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Checkpoint not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"Expected a checkpoint file but {path} is a directory.")
    # `.pth.tar`: PyTorch's pickle under an old convention's name (I-JEPA's weights).
    suffix = ".pth" if path.lower().endswith(".pth.tar") else os.path.splitext(path)[1].lower()
    if suffix not in CHECKPOINT_SUFFIXES:
        raise ValueError(
            f"Unknown checkpoint format {suffix!r} for {path}: "
            f"expected one of {', '.join(CHECKPOINT_SUFFIXES)}."
        )
    try:
        if suffix == ".safetensors":
            state = _read_safetensors(path)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files}
        else:
            state = _read_torch(path)
    except ImportError:
        raise
    except Exception as error:
        raise ValueError(f"Could not read {path} as a {suffix} checkpoint: {error}") from error
    return _strip_wrappers(state)


def _checkpoint_of(model):
    """The checkpoint mapping of the model's family, asked of the model: this reader stands below
    the families (a family's model uses it) and so knows none of them."""
    family = of_model(model)
    if family is None:
        raise TypeError(f"load_weights needs a keras-vit model (ViT, Swin, Eva), got {type(model).__name__}.")
    return family.checkpoint()


_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4"}


def _read_safetensors(path):
    """Reads a `.safetensors` file into float32 arrays, bfloat16 included.

    The format is a little-endian u64 header length, a JSON header of
    {name: {dtype, shape, data_offsets}}, then the raw data. NumPy has no
    bfloat16, which the safetensors package's NumPy reader rejects; a bfloat16
    is the upper half of a float32, so it widens exactly.
    """
    with open(path, "rb") as f:
        data = f.read()
    header_size = int.from_bytes(data[:8], "little")
    if len(data) < 8 or 8 + header_size > len(data):
        raise ValueError("the file is shorter than its header says; it may be truncated")
    header = json.loads(data[8 : 8 + header_size])
    body = memoryview(data)[8 + header_size :]
    state = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name!r} has unsupported dtype {info['dtype']}")
        start, stop = info["data_offsets"]
        array = np.frombuffer(body[start:stop], dtype=_SAFETENSORS_DTYPES[info["dtype"]])
        if info["dtype"] == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        state[name] = array.reshape(info["shape"]).astype(np.float32)
    return state


def _read_torch(path):
    try:
        import torch
    except ImportError as error:
        raise ImportError(
            f"Reading {path} needs PyTorch: `pip install torch`, or convert the checkpoint to .safetensors."
        ) from error
    # weights_only: never unpickle arbitrary objects from a downloaded file.
    state = torch.load(path, map_location="cpu", weights_only=True)
    # timm's `checkpoint_filter_fn`: a training checkpoint's model, and I-JEPA's context encoder.
    for wrapper in ("model", "state_dict", "encoder"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    return {k: v.float().numpy() for k, v in state.items() if hasattr(v, "numpy")}


def _strip_wrappers(state):
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def state_dict(model):
    """A keras-vit model's weights as timm's state dict: C-contiguous float32 NumPy arrays in
    PyTorch's layouts (`save_state_dict` writes it as a `.safetensors` file timm loads)."""
    checkpoint = _checkpoint_of(model)
    targets = checkpoint.targets(model)
    for prefix, layer in checkpoint.optional_layers(model):
        targets += linear(layer, prefix)
    state = {}
    for key, variable, layout in targets:
        value = np.asarray(keras.ops.convert_to_numpy(variable), dtype=np.float32)
        # Transposed views are not contiguous: writers that copy raw memory would scramble them.
        state[key] = np.ascontiguousarray(to_torch(value, layout))
    return state


def save_state_dict(model, path):
    """Writes `state_dict(model)` as a `.safetensors` file (atomically), for timm:
    `timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": path})`."""
    from keras_vit.files import write_bytes

    path = os.fspath(path)
    if not path.endswith(".safetensors"):
        raise ValueError(f"{path}: a state dict is written as .safetensors; end the name with it.")
    write_bytes(path, _safetensors_bytes(state_dict(model)))
    return path


def _safetensors_bytes(state):
    """The safetensors format, as `_read_safetensors` reads it: float32 tensors in key order."""
    header, offset = {}, 0
    for name, array in state.items():
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    body = b"".join(np.ascontiguousarray(array, dtype="<f4").tobytes() for array in state.values())
    return len(text).to_bytes(8, "little") + text + body


def _assign(model, checkpoint, state, source, heads_left_out=None):
    """Assigns `state` to `model`, all or nothing: the checkpoint's keys matched to the model's
    variables, each converted to Keras' layout and checked before any is assigned."""
    state = checkpoint.without_unplaced(model, checkpoint.canonical(dict(state), source), source)
    targets = checkpoint.targets(model, state)
    state, fitting = _optional_layers_that_fit(
        checkpoint.optional_layers(model), state, source, heads_left_out or {}
    )
    targets += fitting
    _check_keys(state, targets, source, checkpoint.mismatch_hint)
    values = []
    for key, variable, layout in targets:
        value = checkpoint.fit(key, np.asarray(state[key], dtype=np.float32), model, source)
        converted = to_keras(value, layout)
        if tuple(converted.shape) != tuple(variable.shape):
            raise CheckpointMismatchError(
                f"{source}: {key!r} has shape {tuple(value.shape)} in the checkpoint, which is "
                f"{tuple(converted.shape)} in Keras layout, but the model's {variable.path} has "
                f"shape {tuple(variable.shape)}."
            )
        values.append((variable, converted))
    # Assign only once everything fits: a failed load leaves the model untouched.
    for variable, value in values:
        variable.assign(value.astype(variable.dtype))


def _optional_layers_that_fit(optional_layers, state, source, heads_left_out):
    """(state without the optional layers that do not fit, their targets that do): the
    pre-logits layer and the heads load when the checkpoint has one that fits, and stay freshly
    initialised, with a warning that says what the checkpoint has, otherwise."""
    targets = []
    for prefix, layer in optional_layers:
        weight = state.get(f"{prefix}.weight")
        if weight is not None and weight.shape[0] == layer.kernel.shape[1]:
            targets += linear(layer, prefix)
            continue
        if prefix in heads_left_out:
            found = f"the checkpoint's has {heads_left_out[prefix]}, trained on other classes"
        else:
            found = "the checkpoint has none" if weight is None else f"the checkpoint's has {weight.shape[0]}"
        logger.warning(
            "%s: %s layer re-initialised: the model has %d outputs; %s.",
            source,
            prefix,
            layer.kernel.shape[1],
            found,
        )
        state.pop(f"{prefix}.weight", None)
        state.pop(f"{prefix}.bias", None)
    return state, targets


def _check_keys(state, targets, source, hint):
    """A CheckpointMismatchError for a key the model needs and the checkpoint lacks, or one the
    checkpoint has and the model has no place for; `hint(unused keys)` says what they suggest."""
    missing = [key for key, _, _ in targets if key not in state]
    if missing:
        raise CheckpointMismatchError(
            f"{source} lacks {len(missing)} key(s) the model needs, e.g. {missing[:5]}. {hint(missing)}"
        )
    unused = sorted(set(state) - {key for key, _, _ in targets})
    if unused:
        raise CheckpointMismatchError(
            f"{source} has {len(unused)} key(s) that this model has no place for, e.g. {unused[:5]}. "
            f"{hint(unused)}"
        )
