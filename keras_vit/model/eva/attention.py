"""Where an Eva looks: attention rollout from [cls] (or the patch mean, for a model pooled by
averaging without one), as for the ViT (`keras_vit.model.vit.attention.rollout`), over an Eva's
blocks, which take the rotary table beside the tokens.

    maps = keras_vit.model.eva.attention.AttentionRollout(model)(images)["attention"]
"""

from keras import ops

from keras_vit.model.vit.attention import head_model, rollout


def attention_scores(model, images, head):
    """`(outputs, scores)`: the model's outputs and each block's attention weights, `(batch,
    heads, tokens, tokens)`, first block first; `head`: the layers after the last block."""
    scores = []

    def block_call(block, x, rope):
        x, block_scores = block(x, rope=rope, training=False, return_attention_scores=True)
        scores.append(block_scores)
        return x

    return head(through_the_blocks(model, images, block_call), training=False), scores


def through_the_blocks(model, images, block_call):
    """Calls an Eva's layers up to its last block on `images` at inference, each block as
    `block_call(block, x, rope)` with the rotary table every block reads (None without one);
    returns the last block's tokens."""
    x = images
    if any(layer.name == "normalization" for layer in model.layers):
        x = model.get_layer("normalization")(x)
    x = model.get_layer("patch_embed")(x)
    rope = model.get_layer("rope")(x) if model.use_rot_pos_emb else None
    if model.use_pre_transformer_norm:
        x = model.get_layer("norm_pre")(x)
    for block in model.blocks:
        x = block_call(block, x, rope)
    return x


class AttentionRollout:
    """Probabilities and attention-rollout maps of an Eva classifier, in one graph:
    `AttentionRollout(model)(images)` returns `{"probabilities", "attention": (batch, rows, cols)}`."""

    def __init__(self, model):
        embed = model.get_layer("patch_embed")
        self.grid_size = tuple(embed.grid_size)
        self.num_prefix_tokens = embed.num_prefix_tokens
        self.from_cls = embed.class_token and model.global_pool != "avg"
        self.outputs_probabilities = model.classifier_activation == "softmax"
        self.model = model
        self.head = head_model(model, model.blocks[-1])

    def __call__(self, images):
        outputs, scores = attention_scores(self.model, images, self.head)
        outputs = ops.cast(outputs, "float32")
        return {
            "probabilities": outputs if self.outputs_probabilities else ops.softmax(outputs, axis=-1),
            "attention": rollout(scores, self.grid_size, self.num_prefix_tokens, from_cls=self.from_cls),
        }
