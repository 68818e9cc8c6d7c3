"""Training: the recipes and `TrainConfig`, `train` as named steps, the model `fit` trains
(augmentation and the DeiT teacher inside the step), the optimizer, callbacks, strategies and
mends for Keras bugs."""
