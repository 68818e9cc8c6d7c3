"""keras-vit export: TF Serving SavedModel, TFLite (fp32, fp16, int8) with metadata, ONNX,
and the checks that every export agrees with Keras.

    keras-vit export runs/latest --format all --output exports
    keras-vit verify exports/vit_nano_patch4_32/export-1
"""
