"""The desktop classifier, driven offscreen with pytest-qt on real CIFAR-10 images."""

import csv
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from conftest import NATIVE_LOG_LINE  # noqa: E402
from PySide6.QtCore import QMimeData, QPointF, QSettings, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDropEvent, QImage  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.apps.desktop.inference import LoadedModel  # noqa: E402
from keras_vit.apps.desktop.window import MainWindow, to_pixmap  # noqa: E402
from keras_vit.export import tflite  # noqa: E402
from keras_vit.inference.classifier import load_classifier  # noqa: E402
from keras_vit.inference.predict import read_image  # noqa: E402

WAIT_MS = 60_000
VENV_BIN = os.path.dirname(sys.executable)


@pytest.fixture
def window(qtbot, tmp_path):
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    main_window = MainWindow(settings=settings)
    qtbot.addWidget(main_window)
    return main_window


def _tflite(export_folder):
    return os.path.join(export_folder["folder"], "model.tflite")


def _litert_top1(model_path, image_path):
    """Top-1 straight from LiteRT, with the library's own image reading."""
    from ai_edge_litert.interpreter import Interpreter

    from keras_vit.inference.tflite_metadata import read_labels

    with open(model_path, "rb") as f:
        labels = read_labels(f.read())
    interpreter = Interpreter(model_path=model_path)
    interpreter.allocate_tensors()
    image_input = interpreter.get_input_details()[0]
    interpreter.set_tensor(image_input["index"], read_image(image_path, (32, 32))[None])
    interpreter.invoke()
    output = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])[0]
    return labels[int(np.argmax(output))]


def _load(qtbot, window, path):
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS):
        window.load_model(path)
    return window.model


def _classify(qtbot, window, path):
    with qtbot.waitSignal(window.prediction_shown, timeout=WAIT_MS) as blocker:
        window.classify_path(path)
    return blocker.args[0]


def test_the_window_shows_litert_top1_on_real_images(qtbot, window, export_folder, image_folder):
    model = _load(qtbot, window, _tflite(export_folder))
    assert model.kind == "tflite" and model.image_size == (32, 32)
    assert model.class_names == export_folder["class_names"]  # from the .tflite's own metadata
    assert "32x32" in window.model_label.text() and "10 classes" in window.model_label.text()
    shown = []
    for path in sorted(image_folder.glob("*.png")):
        prediction = _classify(qtbot, window, path)
        assert window.class_labels[0].text() == _litert_top1(_tflite(export_folder), path)
        assert window.bars[0].format() == f"{100 * prediction.top_k[0][1]:.1f}%"
        assert [label.text() for label in window.class_labels] == [name for name, _ in prediction.top_k]
        assert "ms" in window.time_label.text()
        shown.append(window.class_labels[0].text())
    assert len(shown) == 20


@pytest.mark.parametrize("variant", ["int8", "int16x8", "int8_strict"])
def test_an_integer_model_opens_and_classifies_as_litert_does(
    qtbot, window, export_folder, image_folder, variant
):
    """uint8 pixels in; float probabilities out, or uint8 ones (int8_strict) the app dequantises."""
    from keras_vit.inference.runtimes import TFLiteRunner

    path = os.path.join(export_folder["folder"], f"model_{variant}.tflite")
    model = _load(qtbot, window, path)
    assert model.kind == "tflite" and model.class_names == export_folder["class_names"]
    runner = TFLiteRunner(path)
    for image in sorted(image_folder.glob("*.png"))[:5]:
        top_name, top_probability = _classify(qtbot, window, image).top_k[0]
        expected = runner.predict([read_image(image, runner.image_size)])[0]
        assert top_name == runner.class_names[int(np.argmax(expected))]
        assert top_probability == pytest.approx(float(expected.max()), abs=1e-6)


def test_attention_overlay_from_the_tflite_matches_keras_and_can_be_switched_off(
    qtbot, window, export_folder, image_folder
):
    _load(qtbot, window, _tflite(export_folder))
    assert window.model.has_attention and window.attention_box.isEnabled()
    path = sorted(image_folder.glob("*.png"))[3]
    prediction = _classify(qtbot, window, path)
    assert prediction.attention.shape == (8, 8) and prediction.attention.max() == pytest.approx(1.0)

    keras_model = LoadedModel.open(export_folder["source"])
    assert keras_model.kind == "keras" and keras_model.has_attention
    from_keras = keras_model.classify_file(path)
    np.testing.assert_allclose(prediction.attention, from_keras.attention, atol=1e-4)

    with_overlay = window.image_view.pixmap().toImage()
    window.attention_box.setChecked(False)
    without_overlay = window.image_view.pixmap().toImage()
    assert with_overlay != without_overlay
    assert (
        without_overlay
        == to_pixmap(prediction.image)
        .scaled(
            without_overlay.width(),
            without_overlay.height(),
            Qt.AspectRatioMode.KeepAspectRatio,
            Qt.TransformationMode.SmoothTransformation,
        )
        .toImage()
    )


def test_savedmodel_and_keras_files_load_and_agree_with_the_tflite(
    qtbot, window, export_folder, image_folder
):
    path = sorted(image_folder.glob("*.png"))[0]
    saved_model = os.path.join(os.path.dirname(export_folder["folder"]), str(export_folder["version"]))
    tops = {}
    for source in (_tflite(export_folder), saved_model, export_folder["source"]):
        _load(qtbot, window, source)
        tops[window.model.kind] = _classify(qtbot, window, path).top_k
    assert set(tops) == {"tflite", "saved_model", "keras"}
    for top_k in tops.values():
        assert [name for name, _ in top_k] == [name for name, _ in tops["tflite"]]
        np.testing.assert_allclose([p for _, p in top_k], [p for _, p in tops["tflite"]], atol=1e-5)


def test_a_pretrained_name_opens_as_a_model_and_classifies(qtbot, window, image_folder, hub_cache):
    """`keras-vit app desktop --model NAME`: the window opens a pretrained model by name (from the
    stand-in hub), with its class names."""
    import timm
    from conftest import HUB
    from timm.models import save_for_hf

    reference = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32, patch_size=4, embed_dim=32,
        depth=1, num_heads=4, mlp_ratio=2.0,
    )  # fmt: skip
    labels = {"label_names": ["a", "b", "c"]}
    save_for_hf(reference, HUB.repo_folder("tests/desktop-vit"), model_config=labels)
    model = _load(qtbot, window, "hf-hub:tests/desktop-vit")
    assert model.kind == "keras" and model.image_size == (32, 32)
    top_k = _classify(qtbot, window, sorted(image_folder.glob("*.png"))[0]).top_k
    assert sorted(name for name, _ in top_k) == ["a", "b", "c"]


def test_folder_mode_fills_a_sortable_table_and_exports_csv(
    qtbot, window, export_folder, image_folder, tmp_path
):
    folder = tmp_path / "folder"
    shutil.copytree(image_folder, folder)
    (folder / "zz_broken.png").write_bytes(b"not a png")
    _load(qtbot, window, _tflite(export_folder))
    with qtbot.waitSignal(window.folder_finished, timeout=WAIT_MS) as blocker:
        window.classify_folder(folder)
    rows = blocker.args[0]
    assert len(rows) == 21 and window.table.rowCount() == 21
    assert "21 of 21 images, done, 1 unreadable" in window.folder_label.text()
    broken = [row for row in rows if row["error"]]
    assert len(broken) == 1 and "zz_broken.png is not an image format we can read" in broken[0]["error"]
    for row in rows:
        if not row["error"]:
            assert row["top1"] == _litert_top1(_tflite(export_folder), row["file"])

    names = [window.table.item(i, 0).text() for i in range(21)]
    assert names == sorted(os.path.basename(row["file"]) for row in rows)  # file order at first
    window.table.sortItems(2, Qt.SortOrder.DescendingOrder)  # Probability (%)
    shown = [window.table.item(i, 2).data(Qt.ItemDataRole.DisplayRole) for i in range(20)]
    assert shown == sorted(shown, reverse=True) and isinstance(shown[0], float)

    out = tmp_path / "results.csv"
    window.export_csv(out)
    with open(out, newline="") as f:
        written = list(csv.DictReader(f))
    assert [row["file"] for row in written] == [row["file"] for row in rows]
    assert [row["top1"] for row in written] == [row["top1"] for row in rows]
    assert written[-1]["error"].startswith(str(folder / "zz_broken.png"))


def test_a_folder_run_can_be_cancelled_and_the_window_stays_responsive(
    qtbot, window, export_folder, image_folder, tmp_path
):
    folder = tmp_path / "many"
    folder.mkdir()
    first = sorted(image_folder.glob("*.png"))[0]
    for i in range(40):
        shutil.copy(first, folder / f"{i:02d}.png")
    model = _load(qtbot, window, _tflite(export_folder))
    classify_file = model.classify_file

    def slow_classify_file(path, with_attention=True):
        time.sleep(0.05)  # a slow model, so the run is still going when cancelled
        return classify_file(path, with_attention)

    model.classify_file = slow_classify_file
    with qtbot.waitSignal(window.folder_progress, timeout=WAIT_MS):
        window.classify_folder(folder)
    assert window.cancel_button.isEnabled()
    with qtbot.waitSignal(window.folder_finished, timeout=WAIT_MS) as blocker:
        window.cancel_folder()
        window.tabs.setCurrentIndex(0)  # the UI thread is free during the run
    assert 1 <= len(blocker.args[0]) < 40
    assert "cancelled" in window.folder_label.text() and not window.cancel_button.isEnabled()


def test_bad_images_and_bad_models_show_messages_and_the_app_keeps_working(
    qtbot, window, export_folder, image_folder, tmp_path
):
    def error_after(action):
        with qtbot.waitSignal(window.error_shown, timeout=WAIT_MS) as blocker:
            action()
        assert window.banner.text() == blocker.args[0]
        return blocker.args[0]

    good_image = sorted(image_folder.glob("*.png"))[0]
    assert "Open a model first" in error_after(lambda: window.classify_path(good_image))
    assert "Model not found" in error_after(lambda: window.load_model(tmp_path / "nowhere.tflite"))
    text_file = tmp_path / "notes.tflite"
    text_file.write_text("this is not a model")
    assert "not a TFLite model" in error_after(lambda: window.load_model(text_file))
    bare = tmp_path / "bare.tflite"  # a real model, but no metadata: no class names
    bare.write_bytes(tflite.convert(load_classifier(export_folder["source"]), "fp32"))
    assert "has no metadata" in error_after(lambda: window.load_model(bare))
    backbone = keras_vit.ViT(
        image_size=32, patch_size=4, hidden_dim=32, depth=1, num_heads=4, mlp_dim=64, include_top=False
    )
    backbone.save(tmp_path / "backbone.keras")
    assert "classifier" in error_after(lambda: window.load_model(tmp_path / "backbone.keras"))
    assert window.model is None

    _load(qtbot, window, _tflite(export_folder))
    assert not window.banner.isVisible() and window.error_text() == ""
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 truncated jpeg")
    message = error_after(lambda: window.classify_path(broken))
    assert "broken.jpg" in message and ("corrupt" in message or "not an image" in message)
    _classify(qtbot, window, good_image)  # still works, and the banner is gone
    assert window.error_text() == ""


def test_paste_and_drop(qtbot, window, export_folder, image_folder):
    from PySide6.QtWidgets import QApplication

    path = sorted(image_folder.glob("*.png"))[5]
    expected = _litert_top1(_tflite(export_folder), path)

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(_tflite(export_folder))])
    drop = QDropEvent(
        QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.NoModifier
    )
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS):
        window.dropEvent(drop)  # dropping a model opens it

    QApplication.clipboard().setImage(QImage(str(path)))
    with qtbot.waitSignal(window.prediction_shown, timeout=WAIT_MS) as blocker:
        window.paste()
    assert blocker.args[0].image.shape == (32, 32, 3)
    assert window.class_labels[0].text() == expected

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    drop = QDropEvent(
        QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.NoModifier
    )
    with qtbot.waitSignal(window.prediction_shown, timeout=WAIT_MS):
        window.dropEvent(drop)
    assert window.class_labels[0].text() == expected


def test_the_last_model_is_remembered(qtbot, tmp_path, export_folder):
    settings_file = str(tmp_path / "settings.ini")
    first = MainWindow(settings=QSettings(settings_file, QSettings.Format.IniFormat))
    qtbot.addWidget(first)
    assert first.last_model() is None
    _load(qtbot, first, _tflite(export_folder))
    second = MainWindow(settings=QSettings(settings_file, QSettings.Format.IniFormat))
    qtbot.addWidget(second)
    assert second.last_model() == os.path.abspath(_tflite(export_folder))


def test_screenshot_command(export_folder, image_folder, tmp_path):
    from PIL import Image

    image = sorted(image_folder.glob("*.png"))[0]
    out = tmp_path / "shot.png"
    # As a user's shell has it: the app on a .tflite loads no TensorFlow, and prints nothing.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    env["QT_QPA_PLATFORM"] = "offscreen"
    command = [os.path.join(VENV_BIN, "keras-vit"), "app", "desktop", "--model", _tflite(export_folder)]
    done = subprocess.run(
        command + ["--image", str(image), "--screenshot", str(out)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not re.search(NATIVE_LOG_LINE, done.stderr), done.stderr  # Qt's offscreen platform has its own
    with Image.open(out) as shot:
        assert shot.size[0] >= 800 and shot.size[1] >= 500

    failed = subprocess.run(
        command + ["--image", str(tmp_path / "nowhere.png"), "--screenshot", str(tmp_path / "bad.png")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert failed.returncode == 1 and "Image not found" in failed.stderr
    assert "Traceback" not in failed.stderr


def test_a_distilled_model_with_registers_shows_its_overlay_and_passes_the_mobile_apps_checks(
    qtbot, window, image_folder, tmp_path
):
    """Every prefix token at once ([cls], the distillation token, 2 registers): the attention
    export maps the 8x8 patches as Keras' rollout does, the window shows it, and the phone app
    accepts the export."""
    from apps.mobile.build import describe_model
    from keras_vit.export.exporter import export_model
    from keras_vit.storage.export_folder import ATTENTION_FILE, tflite_file

    class_names = [f"class_{i}" for i in range(10)]
    model = keras_vit.ViT(
        image_size=32, patch_size=4, hidden_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=10,
        distillation_token=True, register_tokens=2, class_names=class_names,
    )  # fmt: skip
    model.save(tmp_path / "distilled.keras")
    manifest = export_model(
        tmp_path / "distilled.keras", output=str(tmp_path / "exports"), formats=("tflite",), quantize=(),
        attention=True, verify=False,
    )  # fmt: skip
    fp32 = os.path.join(manifest["folder"], tflite_file("fp32"))

    loaded = _load(qtbot, window, fp32)
    assert loaded.attention_source == ATTENTION_FILE and window.attention_box.isEnabled()
    path = sorted(image_folder.glob("*.png"))[5]
    shown = _classify(qtbot, window, path)
    from_keras = LoadedModel.open(tmp_path / "distilled.keras").classify_file(path)
    assert shown.attention.shape == (8, 8)
    np.testing.assert_allclose(shown.attention, from_keras.attention, atol=1e-4)
    assert [name for name, _ in shown.top_k] == [name for name, _ in from_keras.top_k]

    described = describe_model(fp32)
    assert described["labels"] == class_names and described["imageSize"] == [32, 32]
