"""The training recipes and the choices `keras-vit train` offers.

Plain data, apart from the training code that applies it.
"""

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# Variables that get no weight decay (matched against variable paths).
NO_DECAY = ["gamma", "beta", "bias", "cls_token", "position_embedding"]

# The two recipes. Values are used where the config leaves None.
PRESETS = {
    # From scratch on small images (DeiT-style, scaled down): strong decay, long warmup.
    "scratch": dict(learning_rate=1e-3, weight_decay=0.05, warmup_epochs=2, drop_path_rate=0.1),
    # Fine-tune a pretrained model: small steps, short warmup, Inception crops.
    "finetune": dict(
        learning_rate=1e-4, weight_decay=0.01, warmup_epochs=1, drop_path_rate=0.1, crop="resized"
    ),
}
