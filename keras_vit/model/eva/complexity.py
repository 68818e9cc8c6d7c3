"""Analytic parameter counts and FLOPs of any Eva configuration (keras-free), counted as timm
builds it. FLOPs count each multiply-accumulate of the matrix products as 2; normalisation,
softmax, activations, the rotation and additions are left out."""


def _norm(a, width):
    return width * (2 if a.norm == "layernorm" else 1)


def _block(a, i):
    d, kv, h = a.embed_dim, a.head_dim * a.kv_heads(i), a.mlp_hidden
    total = 2 * _norm(a, d)
    if a.qkv_fused:
        total += 3 * d * d + (3 * d if a.qkv_bias and a.attn_type == "rope" else 2 * d if a.qkv_bias else 0)
    else:
        total += d * d + 2 * d * kv
        if a.qkv_bias:
            total += d + kv + (kv if a.attn_type == "rope" else 0)
    total += 2 * _norm(a, a.head_dim) if a.qk_norm else 0
    total += _norm(a, d) if a.scale_attn_inner else 0
    total += d * d + d
    if a.init_values is not None and not a.use_post_norm:
        total += d if a.attn_only_layer_scale else 2 * d
    fc1 = {"mlp": 1, "glu": 2, "swiglu": 2}[a.mlp_kind]
    total += fc1 * (d * h + h) + (_norm(a, h) if a.scale_mlp else 0) + h * d + d
    return total


def parameter_count(a):
    """Number of weights of an Eva's `Architecture`."""
    d = a.embed_dim
    total = a.patch_size**2 * a.channels * d + (0 if a.use_pre_transformer_norm else d)
    total += d * a.prefix_tokens
    if a.use_abs_pos_emb:
        total += d * (a.num_patches + (0 if a.no_embed_class else a.prefix_tokens))
    if a.use_rot_pos_emb and a.rope_type == "mixed":
        total += a.depth * a.num_heads * a.head_dim
    total += _norm(a, d) if a.use_pre_transformer_norm else 0
    total += sum(_block(a, i) for i in range(a.depth))
    total += _norm(a, d) * (int(a.final_norm) + int(a.fc_norm))
    if a.global_pool == "map":
        m = int(d * (a.attn_pool_mlp_ratio or a.mlp_ratio))
        total += d + (d * d + d) + (2 * d * d + 2 * d) + (d * d + d) + 2 * d + (d * m + m) + (m * d + d)
    if a.include_top:
        total += d * a.num_classes + a.num_classes
    return total


def forward_flops(a):
    """FLOPs of one image's forward pass (2 per multiply-accumulate)."""
    d, n, t, h = a.embed_dim, a.num_patches, a.num_patches + a.prefix_tokens, a.mlp_hidden
    macs = n * a.patch_size**2 * a.channels * d
    fc1 = {"mlp": 1, "glu": 2, "swiglu": 2}[a.mlp_kind]
    for i in range(a.depth):
        kv = a.head_dim * a.kv_heads(i)
        macs += t * d * (d + 2 * kv) + 2 * t * t * d + t * d * d + t * d * h * fc1 + t * h * d
    if a.global_pool == "map":
        m = int(d * (a.attn_pool_mlp_ratio or a.mlp_ratio))
        macs += d * d + 2 * t * d * d + 2 * t * d + d * d + 2 * d * m
    if a.include_top:
        macs += d * a.num_classes
    return 2 * macs
