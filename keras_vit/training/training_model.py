"""The model `fit` trains: a classifier with its augmentation inside the training step.

`TrainingModel(classifier, augmentation)` takes the pipeline's batches
(`{"images": uint8, "labels": int}`), makes one-hot labels, augments images
and labels together on the accelerator when training, and returns the
classifier's logits with the labels they are scored against. The loss and
metrics read both from its output, so MixUp and CutMix can change the labels
inside the compiled step. Only `classifier` is saved as the run's model and
exported: the augmentation never leaves training.

With a `teacher` (`keras_vit.training.teacher.Teacher`) it trains a distilled student as
DeiT does with hard labels: the [cls] head learns the labels, the distillation
head learns the teacher's top class on the same augmented images, and the loss
is `(1 - w) * CE(head, labels) + w * CE(head_dist, teacher)`. Validation scores
the mean of the heads (what the saved model returns), and `teacher_agreement`
says how often the student's answer is the teacher's.

XLA: on JAX the whole step is compiled (`jax.jit`). On TensorFlow, Keras'
augmentation layers use ops XLA cannot compile (the affine transforms of
RandAugment, MixUp's Beta draws), so the step runs as a TensorFlow graph and
the classifier's forward and backward pass alone are compiled with XLA.
"""

import keras
from keras import ops

from keras_vit.model import registry


@keras.saving.register_keras_serializable(package="keras_vit")
class TrainingModel(keras.Model):
    """Trains `classifier` on `{"images", "labels"}` batches, augmenting inside the step.

    Args:
        classifier: a built Keras classifier (e.g. `keras_vit.ViT`) returning
            logits for float images in [0, 255].
        augmentation: a `keras_vit.training.augment.BatchAugmentation` or None.
        xla_classifier: bool, default False. On TensorFlow, compile the
            classifier's forward and backward pass with XLA (compile this
            model with `jit_compile=False`); ignored on other backends.
        teacher: a `keras_vit.training.teacher.Teacher` or None. Needs a classifier with a
            distillation token (`ViT(distillation_token=True)`, the `deit_*_distilled_*`
            configs). Not part of the config: give it again when rebuilding.
        distillation_weight: float in [0, 1], default 0.5 (DeiT's hard distillation).
    """

    def __init__(
        self,
        classifier,
        augmentation=None,
        xla_classifier=False,
        teacher=None,
        distillation_weight=0.5,
        **kwargs,
    ):
        kwargs.setdefault("dtype", classifier.dtype_policy)  # mixed_float16 gets loss scaling
        super().__init__(**kwargs)
        self.classifier = classifier
        self.augmentation = augmentation
        self.xla_classifier = xla_classifier and keras.backend.backend() == "tensorflow"
        self.num_classes = classifier.output_shape[-1]
        self._compiled = {}
        self.teacher = teacher
        self.distillation_weight = float(distillation_weight)
        if teacher is not None:
            self._add_teacher(teacher)
        self.build()

    def _add_teacher(self, teacher):
        if teacher.num_classes != self.num_classes:
            raise ValueError(
                f"The teacher scores {teacher.num_classes} classes and the student {self.num_classes}."
            )
        if not 0 <= self.distillation_weight <= 1:
            raise ValueError(f"distillation_weight is in [0, 1], got {self.distillation_weight}.")
        # Each head's logits; its layers are the classifier's, so nothing new is trained.
        family = registry.family_of(self.classifier, default=None)  # None: a user's own model
        if family is None:
            raise ValueError(
                f"{self.classifier.name} has no distillation head: the student of a teacher is a ViT "
                "with a distillation token (ViT(distillation_token=True))."
            )
        self._heads = family.distilled_heads(self.classifier)
        # Tracked (frozen) so every backend passes its weights into the step instead of constants.
        self.teacher_model = teacher.model
        self._distillation_loss = keras.losses.CategoricalCrossentropy(from_logits=True)
        self.teacher_agreement = keras.metrics.CategoricalAccuracy(name="teacher_agreement")

    def build(self, input_shape=None):
        """Built from the classifier's input shape: backups restore into it before `fit` runs."""
        if self.augmentation is not None:
            images_shape = (None,) + tuple(self.classifier.input_shape[1:])
            self.augmentation.build(images_shape, (None, self.num_classes))
        self.built = True

    def _xla(self, key, function, images):
        """`function(images)`, compiled with XLA on its own when `xla_classifier` (TensorFlow)."""
        if not self.xla_classifier:
            return function(images)
        import tensorflow as tf

        if key not in self._compiled:
            self._compiled[key] = tf.function(function, jit_compile=True, autograph=False)
        return self._compiled[key](images)

    def call(self, batch, training=False):
        images = ops.cast(batch["images"], "float32")
        labels = ops.one_hot(ops.cast(batch["labels"], "int32"), self.num_classes, dtype="float32")
        if training and self.augmentation is not None:
            images, labels = self.augmentation(images, labels, training=True)
        training = bool(training)
        if self.teacher is None:
            logits = self._xla(
                ("classifier", training), lambda x: self.classifier(x, training=training), images
            )
            return {"logits": logits, "labels": labels}
        heads = self._xla(("heads", training), lambda x: self._heads(x, training=training), images)
        return {
            "logits": (heads["head"] + heads["head_dist"]) / 2,  # the saved classifier's output
            "labels": labels,
            **heads,
            "teacher_labels": self._teacher_labels(images),
        }

    def _teacher_labels(self, images):
        if self.teacher.model is None:  # a host callback, which XLA cannot compile
            return self.teacher.hard_labels(images)
        return self._xla("teacher", self.teacher.hard_labels, images)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        distilling = training and self.teacher is not None
        loss = super().compute_loss(
            x=x,
            y=y_pred["labels"],
            y_pred=y_pred["head"] if distilling else y_pred["logits"],
            sample_weight=sample_weight,
            training=training,
        )
        if not distilling:
            return loss
        distillation = self._distillation_loss(y_pred["teacher_labels"], y_pred["head_dist"], sample_weight)
        return (1 - self.distillation_weight) * loss + self.distillation_weight * distillation

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if self.teacher is not None:
            self.teacher_agreement.update_state(y_pred["teacher_labels"], y_pred["logits"], sample_weight)
        return super().compute_metrics(x, y_pred["labels"], y_pred["logits"], sample_weight)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "classifier": keras.saving.serialize_keras_object(self.classifier),
                "augmentation": keras.saving.serialize_keras_object(self.augmentation),
                "xla_classifier": self.xla_classifier,
                "distillation_weight": self.distillation_weight,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["classifier"] = keras.saving.deserialize_keras_object(config["classifier"])
        config["augmentation"] = keras.saving.deserialize_keras_object(config["augmentation"])
        return cls(**config)
