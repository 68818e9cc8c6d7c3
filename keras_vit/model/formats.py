"""The checkpoint files keras-vit reads, by suffix. Keras-free: `keras_vit.storage.locate` tells
a checkpoint from a model without loading a framework."""

# Pickled PyTorch files: read with torch.load(weights_only=True), the one format that needs torch.
TORCH_SUFFIXES = (".pth", ".pt", ".bin")
CHECKPOINT_SUFFIXES = (".safetensors", ".npz") + TORCH_SUFFIXES
