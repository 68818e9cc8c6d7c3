"""The model: named configs, the layers, the ViT, position embeddings, checkpoint import and
export, complexity, attention maps and block features. Imports nothing above it (only
`keras_vit.files`)."""
