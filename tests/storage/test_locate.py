"""`keras_vit.storage.locate`: the one answer to "what is at this path", for every caller."""

import os

import pytest

from keras_vit.storage.locate import Located, locate


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()  # locate reads names, never contents
    return str(path)


def test_every_kind_of_path_is_told_apart_with_the_file_to_open_and_its_reports_folder(tmp_path):
    run = tmp_path / "runs" / "a"
    _touch(run / "model.keras")
    exports = tmp_path / "exports" / "vit"
    _touch(exports / "1" / "saved_model.pb")
    tflite = _touch(exports / "export-1" / "model.tflite")
    attention = _touch(exports / "export-1" / "model_attention.tflite")
    onnx = _touch(exports / "export-1" / "model.onnx")
    loose = _touch(tmp_path / "loose" / "model_fp16.tflite")
    checkpoint = _touch(tmp_path / "vit_small_patch16_224.safetensors")
    cases = {
        str(run): Located("keras", str(run / "model.keras"), str(run)),
        str(run / "model.keras"): Located("keras", str(run / "model.keras"), str(run)),
        str(exports / "1"): Located("saved_model", str(exports / "1"), str(exports / "export-1")),
        str(exports / "export-1"): Located("tflite", tflite, str(exports / "export-1"), attention),
        tflite: Located("tflite", tflite, str(exports / "export-1"), attention),
        attention: Located("tflite", attention, str(exports / "export-1")),  # not its own attention
        onnx: Located("onnx", onnx, str(exports / "export-1")),
        loose: Located("tflite", loose, str(tmp_path / "loose")),
        checkpoint: Located("checkpoint", checkpoint, str(tmp_path)),
    }
    for path, expected in cases.items():
        assert locate(path) == expected, path


def test_what_is_no_model_gets_one_line_that_says_what_it_takes(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileNotFoundError, match=r"^Model not found: .*nowhere.tflite$"):
        locate(tmp_path / "nowhere.tflite")
    with pytest.raises(ValueError, match=r"photos is neither a run folder \(model.keras\), a SavedModel"):
        locate(tmp_path / "photos")
    with pytest.raises(ValueError, match=r"Cannot run .*notes.txt: expected a .keras file"):
        locate(tmp_path / "notes.txt")


def test_a_checkpoint_is_no_model_to_run_and_an_export_no_weights_to_start_from(tmp_path):
    from keras_vit.inference.runtimes import open_model
    from keras_vit.training.initial_weights import check_source

    checkpoint = _touch(tmp_path / "vit.safetensors")
    with pytest.raises(
        ValueError, match="is a checkpoint, not a model keras-vit runs: fine-tune from it with"
    ):
        open_model(checkpoint)
    exported = _touch(tmp_path / "export-1" / "model.tflite")
    with pytest.raises(
        ValueError, match=r"is an exported model \(tflite\), whose weights cannot be trained on"
    ):
        check_source(exported)
    check_source(checkpoint)  # accepted: read when the run builds its model
