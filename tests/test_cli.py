import io
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import HANG_SECONDS

import keras_vit
from keras_vit.cli import main


def test_models_lists_every_config_with_timms_parameter_count(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in keras_vit.list_models():
        assert name in out
    line = next(line for line in out.splitlines() if line.startswith("vit_base_patch16_224 "))
    assert "86,567,656" in line and "35.13" in line


def test_models_json_uses_the_analytic_counts(capsys):
    assert main(["models", "--json", "--num-classes", "10"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(keras_vit.list_models())
    row = rows["vit_tiny_patch16_224"]
    assert row["params"] == keras_vit.parameter_count("vit_tiny_patch16_224", num_classes=10)
    assert row["gflops"] == pytest.approx(
        keras_vit.forward_flops("vit_tiny_patch16_224", num_classes=10) / 1e9
    )


def _one_line_exit_1(capsys, argv):
    """The error line of a command that must refuse its arguments: one line, exit 1."""
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse's own checks
        code = exit_info.code
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 1, (argv, line)
    return line


def test_bad_arguments_get_one_line_and_exit_1(capsys):
    assert "invalid choice: 'no-such-command'" in _one_line_exit_1(capsys, ["no-such-command"])
    assert "invalid int value: 'abc'" in _one_line_exit_1(capsys, ["train", "--epochs", "abc"])


@pytest.mark.parametrize(
    "argv, says",
    [
        (["models", "--num-classes", "0"], "--num-classes: must be at least 1, got 0"),
        (["evaluate", "run", "--batch-size", "0"], "--batch-size: must be at least 1, got 0"),
        (["export", "run", "--verify-images", "-1"], "--verify-images: must be at least 1, got -1"),
        (["verify", "folder", "--limit", "0"], "--limit: must be at least 1, got 0"),
        (["predict", "m.tflite", "a.jpg", "--top-k", "0"], "--top-k: must be at least 1, got 0"),
        (["app", "mobile", "--model", "m.tflite", "--port", "70000"], "--port: must be from 0 to 65535"),
        (["train", "--image-size", "0"], "image_size must be at least 1, got 0"),
        (["train", "--image-size", "-4"], "image_size must be at least 1, got -4"),
        (["train", "--model", "vit_tiny_patch16_224", "--image-size", "12"], "choose at least 16"),
        # A ViT reads the whole patches of any side, as timm; a Swin's windows need whole ones.
        (["train", "--model", "swin_tiny_patch4_window7_224", "--image-size", "30"], "choose 28 or 32"),
        (["train", "--steps-per-epoch", "0"], "steps_per_epoch must be at least 1, got 0"),
        (["train", "--epochs", "0"], "epochs must be at least 1, got 0"),
        (["train", "--dropout", "1.5"], "dropout is a fraction in [0, 1), got 1.5"),
        (["train", "--drop-path-rate", "-0.1"], "drop_path_rate is a fraction in [0, 1)"),
        (["train", "--validation-split", "1"], "validation_split is a fraction in [0, 1), got 1.0"),
    ],
)
def test_every_numeric_flag_is_checked_before_anything_runs(capsys, tmp_path, argv, says):
    """Once `--image-size 0` fell back to the default and trained 15 epochs."""
    if argv[0] == "train":
        argv = [*argv, "--output", str(tmp_path / "run")]
    assert says in _one_line_exit_1(capsys, argv)
    assert not (tmp_path / "run").exists()


def test_a_saved_model_loads_in_a_fresh_process_after_import_keras_vit(tmp_path, tiny_config):
    """`import keras_vit` registers the classes that `keras.models.load_model` looks up."""
    model = keras_vit.ViT(**tiny_config, class_names=[str(i) for i in range(10)])
    model.save(tmp_path / "m.keras")
    code = (
        "import sys, keras_vit, keras; "
        "m = keras.models.load_model(sys.argv[1]); print(type(m).__name__, m.class_names[3])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "m.keras")], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["ViT", "3"]


def test_python_dash_m_runs_the_cli():
    result = subprocess.run(
        [sys.executable, "-m", "keras_vit", "models", "--json"], capture_output=True, text=True, check=True
    )
    assert len(json.loads(result.stdout)) == len(keras_vit.list_models())


@pytest.mark.parametrize("command", [["--help"], ["models"], ["train", "--help"], ["export", "--help"]])
@pytest.mark.parametrize("start", ["keras-vit", "python -m keras_vit"])
def test_help_and_models_answer_without_importing_a_framework(start, command):
    """TensorFlow, Keras and JAX take seconds to import; `--help` and `models` need none of them."""
    script = os.path.join(os.path.dirname(sys.executable), "keras-vit")
    entry = [script] if start == "keras-vit" else ["-m", "keras_vit"]
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *entry, *command], capture_output=True, text=True, check=True
    )
    assert "vit_huge_patch14_224" in result.stdout or "usage: keras-vit" in result.stdout
    imported = re.findall(r"\|\s+([\w.]+)$", result.stderr, flags=re.MULTILINE)  # -X importtime's table
    assert "keras_vit.cli" in imported
    assert not {"tensorflow", "keras", "jax"} & set(imported)


@pytest.mark.parametrize("start", ["keras-vit", "python -m keras_vit"])
def test_version_is_the_packages_and_answers_without_importing_a_framework(start):
    script = os.path.join(os.path.dirname(sys.executable), "keras-vit")
    entry = [script] if start == "keras-vit" else ["-m", "keras_vit"]
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *entry, "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout == f"keras-vit {keras_vit.__version__}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+", keras_vit.__version__)
    imported = re.findall(r"\|\s+([\w.]+)$", result.stderr, flags=re.MULTILINE)
    assert not {"tensorflow", "keras", "jax"} & set(imported)


def test_training_shows_a_progress_bar_in_a_terminal_and_a_line_per_epoch_in_a_log():
    from keras_vit.training.train import keras_verbosity

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert keras_verbosity(None, Terminal()) == 1  # Keras' progress bar
    assert keras_verbosity(None, io.StringIO()) == 2  # one line per epoch
    assert keras_verbosity(False, Terminal()) == 2
    assert keras_verbosity(True, io.StringIO()) == 1


def test_the_keras_vit_console_script_is_installed():
    from pathlib import Path

    script = Path(sys.executable).with_name("keras-vit")
    assert script.exists(), f"{script} missing: install the package with `pip install -e .`"
    result = subprocess.run([str(script), "models"], capture_output=True, text=True, check=True)
    assert "vit_huge_patch14_224" in result.stdout


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_a_reader_that_leaves_early_ends_the_listing_quietly(flags):
    """`keras-vit models | head -3`: the pipe's reader is gone before the list is written."""
    script = os.path.join(os.path.dirname(sys.executable), "keras-vit")
    read, write = os.pipe()
    os.close(read)  # every write to the pipe now fails: a reader that has left
    try:
        result = subprocess.run([script, "models", *flags], stdout=write, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (0, "")


def test_train_reports_bad_input_in_one_line_with_status_1(capsys, tmp_path):
    line = _one_line_exit_1(capsys, ["train", "--model", "vit_gigantic", "--output", str(tmp_path / "run")])
    assert line.startswith("keras-vit train: error: argument --model: Unknown model config 'vit_gigantic'")
    assert main(["train", "--dataset", str(tmp_path / "missing"), "--output", str(tmp_path / "run")]) == 1
    assert "Dataset not found" in capsys.readouterr().err
    assert main(["train", "--override", "depth", "--output", str(tmp_path / "run")]) == 1
    assert "--override takes KEY=VALUE" in capsys.readouterr().err


FRAMEWORKS_AFTER = """
import json, sys
import keras_vit_cli
try:
    code = keras_vit_cli.main(sys.argv[1:])
except SystemExit as exit_info:  # argparse's own checks
    code = exit_info.code
print(json.dumps({"code": code, "loaded": [m for m in ("tensorflow", "keras") if m in sys.modules]}))
"""


@pytest.mark.parametrize(
    "argv, says",
    [
        (["train", "--model", "vit_tiny_patch16_22"], "Did you mean vit_tiny_patch16_224"),
        (["predict", "nowhere.tflite", "a.jpg"], "Model not found: nowhere.tflite"),
    ],
)
def test_a_typo_is_refused_before_tensorflow_loads(tmp_path, argv, says):
    """Once a mistyped model name took 4 s to refuse: TensorFlow's import."""
    command = [sys.executable, "-c", FRAMEWORKS_AFTER, *argv]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=HANG_SECONDS)
    (line,) = result.stderr.strip().splitlines()
    assert says in line
    assert json.loads(result.stdout) == {"code": 1, "loaded": []}


@pytest.mark.parametrize(
    "weights, says",
    [
        ("missing.safetensors", "Weights not found: missing.safetensors (--weights takes a checkpoint"),
        ("photos", "photos is a folder without a model.keras: --weights takes a checkpoint"),
        ("notes.txt", "notes.txt is not a checkpoint keras-vit reads: --weights takes a checkpoint"),
    ],
)
def test_weights_that_are_no_checkpoint_are_refused_before_a_run_starts(
    capsys, tmp_path, monkeypatch, weights, says
):
    """`--weights` is checked up front, as `--teacher` is: one line, and no run folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "photos").mkdir()
    (tmp_path / "notes.txt").write_text("not weights")
    line = _one_line_exit_1(capsys, ["train", "--weights", weights, "--output", "run"])
    assert line.startswith(f"keras-vit train: error: {says}") and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "best, shown", [(0.0, "(best 0.0000)"), (0.75, "(best 0.7500)"), (None, "(best nan)")]
)
def test_train_says_the_best_validation_accuracy_even_when_it_is_zero(best, shown, capsys, monkeypatch):
    """A run whose best validation accuracy was 0.0 once printed "best nan" (0.0 read as none)."""
    import types

    from keras_vit.training import train

    summary = {
        "config": {"model": "vit_nano_patch4_32", "output": "runs/x"},
        "steps": 2,
        "final": {"val_accuracy": 0.0 if best is None else best},
        "best_val_accuracy": best,
    }
    monkeypatch.setattr(train, "train", lambda config: types.SimpleNamespace(summary=summary))
    assert main(["train", "--epochs", "1"]) == 0
    assert shown in capsys.readouterr().out


def test_train_flags_and_their_defaults_come_from_the_settings_declarations(capsys, monkeypatch):
    """Each `TrainConfig` setting is a flag whose help says its default as `recipes` holds it: a
    changed default changes the help, with nothing else to edit."""
    import dataclasses

    from keras_vit.training import recipes
    from keras_vit.training.config import TrainConfig

    monkeypatch.setitem(recipes.DEFAULTS, "epochs", 7)
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens, too
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--epochs EPOCHS passes over the training images (default: 7; by preset: small-scratch 200)" in text
    )
    for field in dataclasses.fields(TrainConfig):
        if field.metadata.get("flag"):
            flag = "--" + field.name.replace("_", "-")
            assert flag in text and f"(default: {TrainConfig.default_text(field.name)})" in text, flag


def test_the_public_api_answers_in_a_process_the_command_line_started(tmp_path):
    """`keras_vit_cli` keeps `import keras_vit` from loading TensorFlow up front; every public name
    still resolves, each on first use (a notebook that imported the CLI first once saw none)."""
    script = (
        "import sys, keras_vit_cli, keras_vit\n"
        "names = keras_vit.list_models()\n"
        "tensorflow_before = 'tensorflow' in sys.modules\n"
        "model = keras_vit.create_model('vit_nano_patch4_32', depth=1)\n"
        "listed = names == sorted(names) and 'vit_nano_patch4_32' in names\n"
        "print(listed, tensorflow_before, type(model).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_SECONDS
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True", "False", "ViT"]
