"""`.keras` files written by an older keras-vit still load: tests/fixtures/ holds files written
before `keras_vit/` was split into subpackages (tests/fixtures/write_keras_files.py)."""

import os

import keras
import numpy as np

import keras_vit
from keras_vit.training.augment import BatchAugmentation
from keras_vit.training.optimizers import AdamW

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def test_a_vit_saved_before_the_move_loads_and_gives_the_same_logits():
    model = keras.models.load_model(os.path.join(FIXTURES, "vit.keras"))
    saved = np.load(os.path.join(FIXTURES, "vit_logits.npz"))
    assert isinstance(model, keras_vit.ViT) and model.class_names == ["cat", "dog", "fox"]
    np.testing.assert_allclose(np.asarray(model(saved["images"])), saved["logits"], rtol=0, atol=1e-6)


def test_a_compiled_training_model_saved_before_the_move_loads_with_its_augmentation_and_optimizer():
    model = keras.models.load_model(os.path.join(FIXTURES, "training_model.keras"))
    assert isinstance(model, keras_vit.TrainingModel) and isinstance(model.classifier, keras_vit.ViT)
    assert isinstance(model.augmentation, BatchAugmentation) and model.augmentation.mixup == 0.5
    assert isinstance(model.optimizer, AdamW) and int(model.optimizer.iterations) == 1  # its state too
    assert model.optimizer.lr_multipliers == {"patch_encoder": 0.75**2, "block_0": 0.75}
