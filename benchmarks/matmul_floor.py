"""A model's matrix products alone, as one LiteRT file: the time TFLite would take if every other
op (LayerNorm, softmax, GELU, adds, reshapes) were free. Its ratio to ONNX Runtime's whole-model
time is the best ratio any TFLite graph that computes every one of these products can reach on
this CPU with XNNPACK's fp32 kernels: the floor the backbones' goal is measured against.

The shapes come from timm's own model, run once with hooks: every `nn.Linear` and the patch
embedding's convolution (as the matrix product it is: patches x (channels x patch area)) with the
rows it really sees, and each attention's two batched products (queries x keys, weights x
values), the attention pool's single query included. Where keras-vit's export computes the last
block for the tokens its head reads alone (`keras_vit.model.vit.classify`, `eva.classify`), so does
the floor: that block's products but its key and value projections on those rows only.
"""

import numpy as np
import tensorflow as tf
import torch


def matmul_shapes(peer, image_size, reads=None):
    """`(products, batched)`: `[(rows, depth, columns)]` of every dense product and
    `[(heads, rows, depth, columns)]` of every batched one, in timm's `peer` at batch 1.
    `reads`: the tokens the export's last block computes (`classifier_forward`), None for all."""
    products, batched, hooks = [], [], []
    # The export's last block on `reads` tokens but its key and value projections (a fused QKV
    # projection, or an Eva's separate k_proj and v_proj), which still see every token.
    last_block = set(peer.blocks[-1].modules()) if reads is not None else set()
    attention = peer.blocks[-1].attn
    every_token = {getattr(attention, name, None) for name in ("qkv", "k_proj", "v_proj")} - {None}

    def dense(module, inputs, output):
        rows = int(np.prod(inputs[0].shape[:-1]))
        if module in last_block and module not in every_token:
            rows = reads
        products.append((rows, module.in_features, module.out_features))

    def patches(module, inputs, output):
        area = module.kernel_size[0] * module.kernel_size[1] * module.in_channels
        products.append((output.shape[2] * output.shape[3], area, module.out_channels))

    def attention(module, inputs, output):
        keys = inputs[0].shape[1]
        queries = getattr(module, "latent_len", None) or keys  # the attention pool: its latent queries
        heads, width = module.num_heads, module.head_dim
        if module in last_block:
            queries = reads
        batched.append((heads, queries, width, keys))  # scores: q k^T
        batched.append((heads, queries, keys, width))  # output: weights v

    for module in peer.modules():
        if isinstance(module, torch.nn.Linear):
            hooks.append(module.register_forward_hook(dense))
        elif module is getattr(getattr(peer, "patch_embed", None), "proj", None):
            hooks.append(module.register_forward_hook(patches))
        elif hasattr(module, "num_heads") and hasattr(module, "head_dim"):
            hooks.append(module.register_forward_hook(attention))
    with torch.inference_mode():
        peer(torch.zeros(1, 3, image_size, image_size))
    for hook in hooks:
        hook.remove()
    return products, batched


def flops(products, batched):
    """Multiply-adds times two, over every product."""
    return 2 * (sum(r * k * c for r, k, c in products) + sum(h * r * k * c for h, r, k, c in batched))


def matmuls_only_flatbuffer(products, batched):
    """A float32 LiteRT model whose ops are these products and nothing else: constant right-hand
    sides (the weights) for the dense ones, on one input per distinct left-hand shape; two
    inputs of their own for each batched one (shared inputs would let the converter merge equal
    products into one); one output per product, so none is pruned."""
    rng = np.random.default_rng(0)
    dense_shapes = sorted({(r, k) for r, k, _ in products})
    weights = [tf.constant(rng.standard_normal((k, c)).astype("float32") * 0.02) for _, k, c in products]
    specs = [tf.TensorSpec(shape, tf.float32) for shape in dense_shapes]
    for h, r, k, c in batched:
        specs += [tf.TensorSpec((h, r, k), tf.float32), tf.TensorSpec((h, k, c), tf.float32)]
    where = {shape: i for i, shape in enumerate(dense_shapes)}

    @tf.function(input_signature=specs)
    def products_alone(*inputs):
        dense = zip(products, weights, strict=True)
        outputs = [tf.matmul(inputs[where[(r, k)]], w) for (r, k, _), w in dense]
        pairs = inputs[len(dense_shapes) :]
        outputs += [tf.matmul(pairs[2 * i], pairs[2 * i + 1]) for i in range(len(batched))]
        return outputs

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [products_alone.get_concrete_function()], products_alone
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()


def litert_runner(flatbuffer, threads):
    """`run()`: one invoke of the file on fixed inputs (set once: setting them is no product)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer, num_threads=threads)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], np.ones(detail["shape"], np.float32))
    return interpreter.invoke
