"""Mends for Keras bugs keras-vit meets, each naming its bug and the versions it targets.

Each mend changes Keras' behaviour only where the bug bites, and equals Keras'
own code path once the bug is fixed: the test named beside each one guards it.
Tested versions: Keras 3.9 to 3.15 (`pip show keras`); check them again when
Keras moves on.
"""

import keras


def prepare_multi_worker_fit(model, strategy, sample_batch):
    """Mends two places where Keras 3's `fit` breaks under MultiWorkerMirroredStrategy
    (tensorflow/tensorflow#72388; Keras 3.9 to 3.15 at least), for this model and process only:

    - `_maybe_symbolic_build` reduces a distributed batch with `strategy.reduce`, which the
      collective strategy cannot do eagerly: the model is built here from one local batch.
    - `reduce_per_replica` averages every log over axis 0, and logs are scalars: scalars
      are averaged over the workers with no axis.

    Both mended paths equal Keras' own once the bug is fixed;
    tests/training/test_distribute.py::test_multi_worker_training_ends_with_the_same_weights_on_both_workers
    (two processes on 127.0.0.1) guards them.
    """
    from keras.src.backend.tensorflow import trainer as tensorflow_trainer

    with strategy.scope():
        model._symbolic_build(data_batch=sample_batch)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None

    reduce_per_replica = tensorflow_trainer.reduce_per_replica
    if getattr(reduce_per_replica, "mends_scalars", False):
        return

    def reduce_scalars_without_axis(values, strategy, reduction):
        if reduction in ("auto", "mean") and tensorflow_trainer._collective_all_reduce_multi_worker(strategy):

            def reduce(value):
                rank = (value.values[0] if hasattr(value, "values") else value).shape.rank
                return strategy.reduce("MEAN", value, axis=0 if rank else None)

            return keras.tree.map_structure(reduce, values)
        return reduce_per_replica(values, strategy, reduction)

    reduce_scalars_without_axis.mends_scalars = True
    tensorflow_trainer.reduce_per_replica = reduce_scalars_without_axis
