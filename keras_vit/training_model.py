"""The model `fit` trains: a classifier with its augmentation inside the training step.

`TrainingModel(classifier, augmentation)` takes the pipeline's batches
(`{"images": uint8, "labels": int}`), makes one-hot labels, augments images
and labels together on the accelerator when training, and returns the
classifier's logits with the labels they are scored against. The loss and
metrics read both from its output, so MixUp and CutMix can change the labels
inside the compiled step. Only `classifier` is saved as the run's model and
exported: the augmentation never leaves training.

XLA: on JAX the whole step is compiled (`jax.jit`). On TensorFlow, Keras'
augmentation layers use ops XLA cannot compile (the affine transforms of
RandAugment, MixUp's Beta draws), so the step runs as a TensorFlow graph and
the classifier's forward and backward pass alone are compiled with XLA.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class TrainingModel(keras.Model):
    """Trains `classifier` on `{"images", "labels"}` batches, augmenting inside the step.

    Args:
        classifier: a built Keras classifier (e.g. `keras_vit.ViT`) returning
            logits for float images in [0, 255].
        augmentation: a `keras_vit.augment.BatchAugmentation` or None.
        xla_classifier: bool, default False. On TensorFlow, compile the
            classifier's forward and backward pass with XLA (compile this
            model with `jit_compile=False`); ignored on other backends.
    """

    def __init__(self, classifier, augmentation=None, xla_classifier=False, **kwargs):
        kwargs.setdefault("dtype", classifier.dtype_policy)  # mixed_float16 gets loss scaling
        super().__init__(**kwargs)
        self.classifier = classifier
        self.augmentation = augmentation
        self.xla_classifier = xla_classifier and keras.backend.backend() == "tensorflow"
        self.num_classes = classifier.output_shape[-1]
        self._compiled_forward = {}
        self.build()

    def build(self, input_shape=None):
        """Built from the classifier's input shape: backups restore into it before `fit` runs."""
        if self.augmentation is not None:
            images_shape = (None,) + tuple(self.classifier.input_shape[1:])
            self.augmentation.build(images_shape, (None, self.num_classes))
        self.built = True

    def _forward(self, images, training):
        if not self.xla_classifier:
            return self.classifier(images, training=training)
        import tensorflow as tf

        if training not in self._compiled_forward:
            self._compiled_forward[training] = tf.function(
                lambda x: self.classifier(x, training=training), jit_compile=True, autograph=False
            )
        return self._compiled_forward[training](images)

    def call(self, batch, training=False):
        images = ops.cast(batch["images"], "float32")
        labels = ops.one_hot(ops.cast(batch["labels"], "int32"), self.num_classes, dtype="float32")
        if training and self.augmentation is not None:
            images, labels = self.augmentation(images, labels, training=True)
        return {"logits": self._forward(images, training=bool(training)), "labels": labels}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return super().compute_loss(
            x=x, y=y_pred["labels"], y_pred=y_pred["logits"], sample_weight=sample_weight, training=training
        )

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        return super().compute_metrics(x, y_pred["labels"], y_pred["logits"], sample_weight)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "classifier": keras.saving.serialize_keras_object(self.classifier),
                "augmentation": keras.saving.serialize_keras_object(self.augmentation),
                "xla_classifier": self.xla_classifier,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["classifier"] = keras.saving.deserialize_keras_object(config["classifier"])
        config["augmentation"] = keras.saving.deserialize_keras_object(config["augmentation"])
        return cls(**config)
