"""Pretrained weight import: timm and Hugging Face state dicts, and Google's `.npz` files.

Every format is first turned into one canonical form, timm's state dict
(keys such as `blocks.0.attn.qkv.weight`, PyTorch layouts, NumPy arrays),
and then assigned to the Keras model by one function. Reading needs no
PyTorch except for pickled `.pth` / `.bin` files.
"""

import json
import logging
import os
import re

import keras
import numpy as np

from keras_vit.model.formats import CHECKPOINT_SUFFIXES
from keras_vit.model.layers import PatchEncoder
from keras_vit.model.pos_embed import resample_position_embeddings

logger = logging.getLogger(__name__)


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the model: a key is missing, extra, or of another shape."""


def load_weights(model, path):
    """Loads a pretrained checkpoint into a `keras_vit.ViT`.

    Reads timm state dicts and Hugging Face transformers ViT checkpoints
    (`.safetensors`, `.pth`, `.pt`, `.bin`; float32, float16 or bfloat16) and
    the original Google ViT and AugReg `.npz` checkpoints
    (`keras_vit.load_weights` reads keras-vit's own runs too). Position
    embeddings are resampled when the model's patch grid differs from the
    checkpoint's; the classifier is loaded when the class counts match and left
    freshly initialised otherwise.

    Args:
        model: a `keras_vit.ViT`, e.g. from `keras_vit.create_model`.
        path: the checkpoint file.

    Returns:
        The model, for chaining.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: the file is not a readable checkpoint of a known format.
        CheckpointMismatchError: the checkpoint does not fit the model; the
            message names the key and both shapes.
    """
    encoder = _patch_encoder(model)  # a ViT, checked before the file is read
    _assign(model, encoder, read_checkpoint(path), source=os.fspath(path))
    return model


def load_state(model, state, source, heads_left_out=None):
    """Assigns a timm-style state dict (`read_checkpoint`, `state_dict`) to a `keras_vit.ViT`, as
    `load_weights` does; `source` names it in messages, and `heads_left_out` the heads the caller
    took out of `state` for being trained on other classes (`{"head": outputs}`). Returns the model."""
    _assign(model, _patch_encoder(model), state, source=source, heads_left_out=heads_left_out or {})
    return model


def read_checkpoint(path):
    """Reads a checkpoint file into a timm-style state dict of NumPy arrays."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Checkpoint not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"Expected a checkpoint file but {path} is a directory.")
    suffix = os.path.splitext(path)[1].lower()
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
                return _npz_to_timm({k: npz[k] for k in npz.files}, path)
        else:
            state = _read_torch(path)
    except (CheckpointMismatchError, ImportError):
        raise
    except Exception as error:
        raise ValueError(f"Could not read {path} as a {suffix} checkpoint: {error}") from error
    state = _strip_wrappers(state)
    if any(k.endswith("embeddings.cls_token") for k in state):
        state = _transformers_to_timm(state)
    return state


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
    for wrapper in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    return {k: v.float().numpy() for k, v in state.items() if hasattr(v, "numpy")}


def _strip_wrappers(state):
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


# Hugging Face transformers' ViT names (hub files use the first form, transformers 5's
# modules the second), as regular expressions over the key without its "vit." prefix.
_TRANSFORMERS_RENAMES = [
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.distillation_token$", "dist_token"),  # DeiT
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.layernorm_before\.", r"blocks.\1.norm1."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.layernorm_after\.", r"blocks.\1.norm2."),
    (
        r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:attention\.)?(query|key|value|[qkv]_proj)\.",
        r"blocks.\1.attn.\2.",
    ),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:output\.dense|o_proj)\.", r"blocks.\1.attn.proj."),
    (r"^(?:encoder\.layer\.(\d+)\.intermediate\.dense|layers\.(\d+)\.mlp\.fc1)\.", r"blocks.\1\2.mlp.fc1."),
    (r"^(?:encoder\.layer\.(\d+)\.output\.dense|layers\.(\d+)\.mlp\.fc2)\.", r"blocks.\1\2.mlp.fc2."),
    (r"^layernorm\.", "norm."),
    (r"^pooler\.dense\.", "pre_logits.fc."),
    (r"^(?:cls_)?classifier\.", "head."),
    (r"^distillation_classifier\.", "head_dist."),  # DeiT's second head
]


def _transformers_to_timm(state):
    """Converts a transformers `ViTModel` / `ViTForImageClassification` (or DeiT's
    `DeiTForImageClassificationWithTeacher`) state dict to timm's."""
    renamed = {}
    for key, value in state.items():
        key = re.sub(r"^(?:vit|deit)\.", "", key)
        for pattern, replacement in _TRANSFORMERS_RENAMES:
            key, count = re.subn(pattern, replacement, key)
            if count:
                break
        renamed[key] = value
    # Separate query, key and value projections become timm's fused qkv.
    names = {"query": "q_proj", "key": "k_proj", "value": "v_proj"}
    for key in [k for k in renamed if re.fullmatch(r"blocks\.\d+\.attn\.(query|q_proj)\.(weight|bias)", k)]:
        block, _, kind = key.rsplit(".", 2)
        parts = []
        for part in ("query", "key", "value"):
            part_key = next(
                (f"{block}.{n}.{kind}" for n in (part, names[part]) if f"{block}.{n}.{kind}" in renamed), None
            )
            if part_key is None:
                raise CheckpointMismatchError(f"{block} has a query but no {part} projection.")
            parts.append(renamed.pop(part_key))
        renamed[f"{block}.qkv.{kind}"] = np.concatenate(parts)
    return renamed


def _npz_to_timm(w, path):
    """Converts google-research/vision_transformer `.npz` keys to timm's, as timm's `_load_weights`."""
    prefix = next((p for p in ("", "opt/target/") if f"{p}embedding/kernel" in w), None)
    if prefix is None:
        hint = (
            " It looks like a big_vision checkpoint, which is not supported."
            if any(k.startswith("params/") for k in w)
            else ""
        )
        raise CheckpointMismatchError(f"{path} has no 'embedding/kernel': not a Google ViT checkpoint.{hint}")
    w = {k[len(prefix) :]: np.asarray(v, dtype=np.float32) for k, v in w.items() if k.startswith(prefix)}
    used = set()

    def take(key):
        if key not in w:
            raise CheckpointMismatchError(f"{path} lacks the key {key!r}.")
        used.add(key)
        return w[key]

    state = {
        "patch_embed.proj.weight": take("embedding/kernel").transpose(3, 2, 0, 1),
        "patch_embed.proj.bias": take("embedding/bias"),
        "cls_token": take("cls"),
        "pos_embed": take("Transformer/posembed_input/pos_embedding"),
        "norm.weight": take("Transformer/encoder_norm/scale"),
        "norm.bias": take("Transformer/encoder_norm/bias"),
    }
    for npz_name, timm_name in (("head", "head"), ("pre_logits", "pre_logits.fc")):
        if f"{npz_name}/kernel" in w:
            state[f"{timm_name}.weight"] = take(f"{npz_name}/kernel").T
            state[f"{timm_name}.bias"] = take(f"{npz_name}/bias")
    i = 0
    while f"Transformer/encoderblock_{i}/LayerNorm_0/scale" in w:
        src, dst = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        mha = src + "MultiHeadDotProductAttention_1/"
        qkv = [take(f"{mha}{n}/kernel") for n in ("query", "key", "value")]
        state[dst + "attn.qkv.weight"] = np.concatenate([k.reshape(k.shape[0], -1).T for k in qkv])
        state[dst + "attn.qkv.bias"] = np.concatenate(
            [take(f"{mha}{n}/bias").reshape(-1) for n in ("query", "key", "value")]
        )
        out = take(f"{mha}out/kernel")  # (heads, head_dim, dim)
        state[dst + "attn.proj.weight"] = out.reshape(-1, out.shape[-1]).T
        state[dst + "attn.proj.bias"] = take(f"{mha}out/bias")
        for ln, name in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            state[f"{dst}{name}.weight"] = take(f"{src}{ln}/scale")
            state[f"{dst}{name}.bias"] = take(f"{src}{ln}/bias")
        for r in range(2):
            state[f"{dst}mlp.fc{r + 1}.weight"] = take(f"{src}MlpBlock_3/Dense_{r}/kernel").T
            state[f"{dst}mlp.fc{r + 1}.bias"] = take(f"{src}MlpBlock_3/Dense_{r}/bias")
        i += 1
    unused = sorted(set(w) - used)
    if unused:
        raise CheckpointMismatchError(
            f"{path} has {len(unused)} key(s) that this ViT has no place for, e.g. {unused[:5]}."
        )
    return state


def _linear(layer, prefix):
    """(timm key, Keras variable, PyTorch-to-Keras layout) for a Dense layer."""
    return [(f"{prefix}.weight", layer.kernel, np.transpose), (f"{prefix}.bias", layer.bias, None)]


def _norm(layer, prefix):
    return [(f"{prefix}.weight", layer.gamma, None), (f"{prefix}.bias", layer.beta, None)]


def _patch_kernel(weight):
    return weight.transpose(2, 3, 1, 0)  # (out, in, kh, kw) -> (kh, kw, in, out)


def _patch_encoder(model):
    try:
        encoder = model.get_layer("patch_encoder")
    except (AttributeError, ValueError):
        encoder = None
    if not isinstance(encoder, PatchEncoder) or not hasattr(model, "blocks"):
        raise TypeError(f"load_weights needs a keras_vit.ViT, got {type(model).__name__}.")
    return encoder


def _targets(model, encoder, final_norm="norm"):
    """(timm key, Keras variable, PyTorch-to-Keras layout) for every layer but the optional
    pre-logits and head(s)."""
    targets = [
        ("patch_embed.proj.weight", encoder.projection.kernel, _patch_kernel),
        ("patch_embed.proj.bias", encoder.projection.bias, None),
        ("pos_embed", encoder.position_embedding, None),
    ]
    for key, present in (
        ("cls_token", "class_token"),
        ("dist_token", "distillation_token"),
        ("reg_token", "register_tokens"),
    ):
        if getattr(encoder, present):
            targets.append((key, getattr(encoder, key), None))
    for i, block in enumerate(model.blocks):
        p = f"blocks.{i}"
        targets += _norm(block.norm1, f"{p}.norm1")
        targets += _linear(block.attention.qkv, f"{p}.attn.qkv")
        targets += _linear(block.attention.proj, f"{p}.attn.proj")
        targets += _norm(block.norm2, f"{p}.norm2")
        targets += _linear(block.fc1, f"{p}.mlp.fc1")
        targets += _linear(block.fc2, f"{p}.mlp.fc2")
        if block.layer_scale is not None:
            targets += [(f"{p}.ls1.gamma", block.ls1, None), (f"{p}.ls2.gamma", block.ls2, None)]
    return targets + _norm(model.get_layer("norm"), final_norm)


def _optional_layers(model, encoder):
    """(timm prefix, Dense layer) of the layers a checkpoint may lack: pre-logits and head(s)."""
    optional = []
    if model.representation_size is not None:
        optional.append(("pre_logits.fc", model.get_layer("pre_logits")))
    if model.include_top:
        optional.append(("head", model.get_layer("head")))
        if encoder.distillation_token:
            optional.append(("head_dist", model.get_layer("head_dist")))
    return optional


_TO_TORCH = {np.transpose: np.transpose, _patch_kernel: lambda w: w.transpose(3, 2, 0, 1)}


def state_dict(model):
    """A `keras_vit.ViT`'s weights as timm's state dict: C-contiguous float32 NumPy arrays in
    PyTorch's layouts (`save_state_dict` writes it as a `.safetensors` file timm loads)."""
    encoder = _patch_encoder(model)
    # timm names the LayerNorm after a "gap" pooling fc_norm.
    after_pooling = model.pooling == "gap" and not model.norm_before_pooling
    targets = _targets(model, encoder, final_norm="fc_norm" if after_pooling else "norm")
    for prefix, layer in _optional_layers(model, encoder):
        targets += _linear(layer, prefix)
    state = {}
    for key, variable, to_keras in targets:
        value = np.asarray(keras.ops.convert_to_numpy(variable), dtype=np.float32)
        # Transposed views are not contiguous: writers that copy raw memory would scramble them.
        state[key] = np.ascontiguousarray(_TO_TORCH[to_keras](value) if to_keras is not None else value)
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


def _assign(model, encoder, state, source, heads_left_out=None):
    """Assigns `state` to `model`, all or nothing: the checkpoint's keys matched to the model's
    variables, each converted to Keras' layout and checked before any is assigned."""
    state = dict(state)
    final_norm = "fc_norm" if "fc_norm.weight" in state and "norm.weight" not in state else "norm"
    targets = _targets(model, encoder, final_norm)
    state, fitting = _optional_layers_that_fit(model, encoder, state, source, heads_left_out or {})
    targets += fitting
    _check_keys(state, targets, source)
    values = []
    for key, variable, to_keras in targets:
        value = np.asarray(state[key], dtype=np.float32)
        if key == "pos_embed":
            value = _fit_position_embeddings(value, encoder, source)
        elif key == "patch_embed.proj.weight":
            value = _fit_input_channels(value, encoder.projection.kernel.shape[2])
        converted = to_keras(value) if to_keras is not None else value
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


def _optional_layers_that_fit(model, encoder, state, source, heads_left_out):
    """(state without what the model has no place for, the optional layers' targets): the
    pre-logits layer and the heads load when the checkpoint has one that fits, and stay freshly
    initialised, with a warning that says what the checkpoint has, otherwise."""
    if model.representation_size is None and any(k.startswith("pre_logits.") for k in state):
        logger.warning("%s: ignoring the checkpoint's pre-logits layer; the model has none.", source)
        state = {k: v for k, v in state.items() if not k.startswith("pre_logits.")}
    if not model.include_top:
        state = {k: v for k, v in state.items() if not k.startswith(("head.", "head_dist."))}
    targets = []
    for prefix, layer in _optional_layers(model, encoder):
        weight = state.get(f"{prefix}.weight")
        if weight is not None and weight.shape[0] == layer.kernel.shape[1]:
            targets += _linear(layer, prefix)
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


def _check_keys(state, targets, source):
    """A CheckpointMismatchError for a key the model needs and the checkpoint lacks, or one the
    checkpoint has and the model has no place for."""
    missing = [key for key, _, _ in targets if key not in state]
    if missing:
        raise CheckpointMismatchError(
            f"{source} lacks {len(missing)} key(s) the model needs, e.g. {missing[:5]}. "
            f"Is it a plain ViT checkpoint of the same depth?"
        )
    unused = sorted(set(state) - {key for key, _, _ in targets})
    if unused:
        hint = "Is it a plain ViT checkpoint of the same depth?"
        if any(k.endswith(".ls1.gamma") for k in unused):
            hint = "It has LayerScale (DeiT III): use a deit3_* config, or ViT(layer_scale=...)."
        elif "dist_token" in unused:
            hint = "It is a distilled DeiT: use a deit_*_distilled_* config, or ViT(distillation_token=True)."
        raise CheckpointMismatchError(
            f"{source} has {len(unused)} key(s) that this ViT has no place for, e.g. {unused[:5]}. {hint}"
        )


def _fit_position_embeddings(pos_embed, encoder, source):
    expected = tuple(encoder.position_embedding.shape)
    if pos_embed.shape == expected or pos_embed.ndim != 3 or pos_embed.shape[-1] != expected[-1]:
        return pos_embed  # equal, or a mismatch that the shape check reports
    prefix = encoder.position_prefix_tokens
    old_tokens = pos_embed.shape[1] - prefix
    side = int(round(old_tokens**0.5))
    if side * side != old_tokens:
        raise CheckpointMismatchError(
            f"{source}: 'pos_embed' has shape {pos_embed.shape}, which is no square patch grid "
            f"plus {prefix} [cls] token; the model's has shape {expected}."
        )
    logger.info(
        "%s: resampling position embeddings from a %dx%d to a %dx%d patch grid.",
        source,
        side,
        side,
        *encoder.grid_size,
    )
    return resample_position_embeddings(pos_embed, encoder.grid_size, (side, side), prefix)


def _fit_input_channels(weight, channels):
    """Sums RGB filters for a grayscale model, as timm's `adapt_input_conv`."""
    if weight.ndim == 4 and channels == 1 and weight.shape[1] == 3:
        return weight.sum(axis=1, keepdims=True)
    return weight
