"""Pretrained ViTs by name (`keras_vit.model.pretrained`), downloaded from the stand-in hub that
conftest starts (tests/hub_server.py): repos written here by timm and transformers themselves."""

import contextlib
import json
import os
import re
import shutil

import numpy as np
import pytest
import timm
import timm.data
import torch
from conftest import HANG_SECONDS, HUB, REAL_VIT_TI, serve_real_vit_ti
from timm.models import save_for_hf

import keras_vit
from keras_vit.cli import main
from keras_vit.model import pretrained

# timm's ViT-Ti/16 made tiny: what a timm repo's config.json records as model_args.
TINY_TIMM = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)
LABELLED = {"label_names": list("abcde")}
# A gap-pooled ViT made tiny (timm's fc_norm: the LayerNorm after the pooling when not before).
GAP_TINY = dict(hidden_dim=32, depth=1, num_heads=2, mlp_dim=64, image_size=32, num_classes=2)


def _timm_repo(repo, model, **options):
    folder = HUB.repo_folder(repo)
    shutil.rmtree(folder, ignore_errors=True)
    save_for_hf(model, folder, **options)
    return folder


def _pixels(seed=0, size=32):
    return np.random.default_rng(seed).uniform(0, 255, (2, size, size, 3)).astype("float32")


def _timm_logits(model, pixels):
    """timm's logits for [0, 255] pixels, normalised as its pretrained_cfg says."""
    config = model.pretrained_cfg
    x = (pixels / 255 - np.array(config["mean"])) / np.array(config["std"])
    with torch.no_grad():
        return model.eval()(torch.from_numpy(x.transpose(0, 3, 1, 2)).float()).numpy()


@pytest.fixture(scope="module")
def tiny_timm():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=5, **TINY_TIMM)


def test_a_timm_repo_gives_timms_logits_and_its_class_names_and_timm_reads_the_stand_in_too(
    tiny_timm, hub_cache, record_parity
):
    _timm_repo("tests/tiny-vit", tiny_timm, model_config=LABELLED, safe_serialization=True)
    model = keras_vit.create_model("hf-hub:tests/tiny-vit", pretrained=True)
    assert model.class_names == list("abcde") and model.image_size == (32, 32)
    pixels = _pixels()
    difference = np.abs(np.asarray(model(pixels)) - _timm_logits(tiny_timm, pixels)).max()
    record_parity("timm hub repo (hf-hub:), tiny ViT logits", difference, 1e-4)
    assert difference < 1e-4
    # timm's own loader takes the stand-in's answers: the same hub protocol, the same weights.
    by_timm = timm.create_model("hf-hub:tests/tiny-vit", pretrained=True)
    assert np.abs(_timm_logits(by_timm, pixels) - _timm_logits(tiny_timm, pixels)).max() == 0


def test_a_pickled_checkpoint_loads_without_unpickling_code(tiny_timm, hub_cache, monkeypatch):
    _timm_repo("tests/tiny-vit-bin", tiny_timm, safe_serialization=False)
    assert sorted(os.listdir(HUB.repo_folder("tests/tiny-vit-bin"))) == ["config.json", "pytorch_model.bin"]
    loads = []
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(k.get("weights_only")) or load(*a, **k))
    model = keras_vit.create_model("hf-hub:tests/tiny-vit-bin", pretrained=True)
    assert loads == [True]
    pixels = _pixels(1)
    assert np.abs(np.asarray(model(pixels)) - _timm_logits(tiny_timm, pixels)).max() < 1e-4
    assert model.class_names is None  # no label names, and no label set has 5 classes


def test_a_transformers_repo_gives_transformers_logits_labels_and_normalisation(hub_cache, record_parity):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        image_size=32, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, id2label=dict(enumerate(["cat", "dog", "fox"])),
    )  # fmt: skip
    torch.manual_seed(1)
    reference = transformers.ViTForImageClassification(config).eval()
    folder = HUB.repo_folder("tests/tiny-transformers")
    shutil.rmtree(folder, ignore_errors=True)
    reference.save_pretrained(folder)
    processor = transformers.ViTImageProcessor(image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.25, 0.3])
    processor.save_pretrained(folder)
    model = keras_vit.create_model("hf-hub:tests/tiny-transformers", pretrained=True)
    assert model.class_names == ["cat", "dog", "fox"]
    pixels = _pixels(2)
    x = (pixels / 255 - np.array([0.4, 0.5, 0.6])) / np.array([0.2, 0.25, 0.3])
    with torch.no_grad():
        expected = reference(torch.from_numpy(x.transpose(0, 3, 1, 2)).float()).logits.numpy()
    difference = np.abs(np.asarray(model(pixels)) - expected).max()
    record_parity("transformers hub repo (hf-hub:), tiny ViT logits", difference, 1e-4)
    assert difference < 1e-4
    # Its image processor resizes to 224x224, bilinear, with no crop: read the same way.
    assert (model.crop_pct, model.crop_mode, model.interpolation) == (1.0, "squash", "bilinear")
    # Published for timm: the nearest timm architecture, with model_args for the rest.
    folder = keras_vit.save_pretrained(model, HUB.repo_folder("tests/republished"))
    by_timm = timm.create_model(f"local-dir:{folder}", pretrained=True)
    assert np.abs(_timm_logits(by_timm, pixels) - expected).max() < 1e-4


def test_a_transformers_deit_with_its_distillation_head_gives_its_logits(hub_cache, record_parity):
    transformers = pytest.importorskip("transformers")
    config = transformers.DeiTConfig(
        image_size=32, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, id2label=dict(enumerate(["ant", "bee"])),
        architectures=["DeiTForImageClassificationWithTeacher"],
    )  # fmt: skip
    torch.manual_seed(2)
    reference = transformers.DeiTForImageClassificationWithTeacher(config).eval()
    folder = HUB.repo_folder("tests/tiny-deit")
    shutil.rmtree(folder, ignore_errors=True)
    reference.save_pretrained(folder)
    model = keras_vit.create_model("hf-hub:tests/tiny-deit", pretrained=True)
    assert model.class_names == ["ant", "bee"] and model.distillation_token
    pixels = _pixels(6)
    x = (pixels / 255 - 0.5) / 0.5  # no preprocessor_config.json: the ViT default
    with torch.no_grad():
        expected = reference(torch.from_numpy(x.transpose(0, 3, 1, 2)).float()).logits.numpy()
    difference = np.abs(np.asarray(model(pixels)) - expected).max()
    record_parity("transformers DeiT (with teacher head) hub repo, tiny logits", difference, 1e-4)
    assert difference < 1e-4


@pytest.mark.parametrize(
    "entry_point, tag, model_args, size",
    [
        # The width and depth given, the MLP's ratio not: timm's MLP is 4 x 64, not ViT-S's 1536.
        ("vit_small_patch16_224", "augreg_in21k_ft_in1k", dict(depth=2, embed_dim=64, num_heads=2), 224),
        # A Swin's stages narrowed and shortened, its window and MLP ratio the entry point's.
        ("swin_tiny_patch4_window7_224", "ms_in1k", dict(embed_dim=32, depths=[1, 1], num_heads=[2, 4]), 224),
    ],
)  # fmt: skip
def test_a_timm_repos_model_args_build_what_timms_entry_point_builds_with_them(
    entry_point, tag, model_args, size, hub_cache, record_parity
):
    """timm builds the entry point's own arguments with `model_args` over them, then derives the
    rest from them; a name alone keeps the registry's architecture."""
    torch.manual_seed(3)
    reference = timm.create_model(entry_point, pretrained=False, **model_args)
    _timm_repo(f"timm/{entry_point}.{tag}", reference, model_args=model_args)
    by_timm = timm.create_model(f"hf-hub:timm/{entry_point}.{tag}", pretrained=True)
    model = keras_vit.create_model(f"hf-hub:timm/{entry_point}.{tag}", pretrained=True)
    count = sum(p.numel() for p in by_timm.parameters())
    assert model.count_params() == count == sum(p.numel() for p in reference.parameters())
    pixels = _pixels(8, size=size)[:1]
    difference = np.abs(np.asarray(model(pixels)) - _timm_logits(by_timm, pixels)).max()
    record_parity(f"timm repo with model_args ({entry_point}), logits", difference, 1e-4)
    assert difference < 1e-4
    assert keras_vit.parameter_count(entry_point) == sum(
        p.numel() for p in timm.create_model(entry_point, pretrained=False).parameters()
    )


@pytest.fixture(scope="module")
def imagenet_vit_ti():
    """A randomly initialised ViT-Ti/16 where the hub keeps timm's default tag for it: a config
    with 1000 classes and no label names, as timm's own ImageNet repos have."""
    torch.manual_seed(2)
    model = timm.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1k", pretrained=False)
    entry = pretrained.pretrained_table()["tags"]["vit_tiny_patch16_224.augreg_in21k_ft_in1k"]
    _timm_repo(entry["repo"], model, safe_serialization=True)
    return model


def test_a_timm_tag_downloads_once_reads_the_cache_offline_and_names_imagenet_classes(
    imagenet_vit_ti, hub_cache, monkeypatch
):
    from huggingface_hub import constants

    before = len(HUB.requests)
    model = keras_vit.create_model("vit_tiny_patch16_224", pretrained=True)  # timm's default tag
    assert len(HUB.requests) > before
    assert model.image_size == (224, 224) and len(model.class_names) == 1000
    assert model.class_names[281] == "tabby, tabby cat"  # timm's ImageNetInfo descriptions
    pixels = _pixels(3, size=224)[:1]
    assert np.abs(np.asarray(model(pixels)) - _timm_logits(imagenet_vit_ti, pixels)).max() < 1e-4

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    asked = len(HUB.requests)
    again = keras_vit.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1k", pretrained=True)
    assert len(HUB.requests) == asked  # the cache alone
    assert np.array_equal(np.asarray(again(pixels)), np.asarray(model(pixels)))


def test_overrides_give_a_new_head_or_resampled_position_embeddings(tiny_timm, hub_cache):
    _timm_repo("tests/tiny-vit", tiny_timm, model_config=LABELLED, safe_serialization=True)
    original = keras_vit.create_model("hf-hub:tests/tiny-vit", pretrained=True)
    new_head = keras_vit.create_model("hf-hub:tests/tiny-vit", pretrained=True, num_classes=3)
    assert new_head.num_classes == 3 and new_head.class_names is None
    bigger = keras_vit.create_model("hf-hub:tests/tiny-vit", pretrained=True, image_size=64)
    assert bigger.image_size == (64, 64) and bigger.class_names == list("abcde")
    for name in ("block_0/attention/qkv/kernel", "patch_encoder/projection/kernel"):
        weights = [{w.path: np.asarray(w) for w in m.weights}[name] for m in (original, new_head, bigger)]
        assert np.array_equal(weights[0], weights[1]) and np.array_equal(weights[0], weights[2])


def test_save_pretrained_writes_what_timm_and_keras_vit_load_with_the_same_logits(tmp_path, hub_cache):
    model = keras_vit.create_model(
        "vit_tiny_patch16_224", image_size=32, num_classes=3, class_names=["a", "b", "c"],
        image_mean=[0.5] * 3, image_std=[0.5] * 3,
    )  # fmt: skip
    folder = keras_vit.save_pretrained(model, tmp_path / "published")
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "published" / "config.json").read_text())
    assert config["label_names"] == ["a", "b", "c"] and config["architecture"] == "vit_tiny_patch16_224"
    assert config["pretrained_cfg"]["interpolation"] == "bilinear"  # the transform keras-vit applies
    pixels = _pixels(4)
    expected = np.asarray(model(pixels))
    by_timm = timm.create_model(f"local-dir:{folder}", pretrained=True)
    assert np.abs(_timm_logits(by_timm, pixels) - expected).max() < 1e-4
    again = keras_vit.create_model(f"local-dir:{folder}", pretrained=True)
    assert again.class_names == ["a", "b", "c"]
    assert np.abs(np.asarray(again(pixels)) - expected).max() < 1e-5


@pytest.mark.parametrize(
    "name, overrides, nearest",
    [
        ("vit_nano_patch4_32", dict(num_classes=10), "vit_tiny_patch16_224"),  # the quickstart's model
        ("vit_tiny_patch16_224", dict(depth=2, image_size=32, num_classes=3), "vit_tiny_patch16_224"),
        ("vit_base_patch16_gap_224", dict(GAP_TINY, norm_before_pooling=False), "vit_base_patch16_gap_224"),
    ],
)  # fmt: skip
def test_any_vit_publishes_as_the_nearest_timm_architecture_with_model_args(
    name, overrides, nearest, tmp_path, hub_cache
):
    """As timm's `save_for_hf`: the arguments that differ from the architecture go in `model_args`,
    which `timm.create_model("local-dir:...")` applies."""
    model = keras_vit.create_model(name, image_mean=[0.5] * 3, image_std=[0.5] * 3, **overrides)
    folder = keras_vit.save_pretrained(model, tmp_path / "published")
    assert json.loads((tmp_path / "published" / "config.json").read_text())["architecture"] == nearest
    pixels = _pixels(7, size=model.image_size[0])
    by_timm = timm.create_model(f"local-dir:{folder}", pretrained=True)
    assert np.abs(_timm_logits(by_timm, pixels) - np.asarray(model(pixels))).max() < 1e-4


def test_save_pretrained_refuses_in_one_line_only_what_timm_cannot_build(tmp_path):
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, depth=1, representation_size=16)
    with pytest.raises(ValueError, match="timm cannot build this model: its representation_size differ"):
        keras_vit.save_pretrained(model, tmp_path / "x")
    with pytest.raises(ValueError, match="'vit_nano_patch4_32' is not one keras-vit and timm share"):
        keras_vit.save_pretrained(model, tmp_path / "x", architecture="vit_nano_patch4_32")
    assert not os.path.exists(tmp_path / "x")


def test_predict_prints_the_classes_of_a_pretrained_name(imagenet_vit_ti, hub_cache, tmp_path, capsys):
    from PIL import Image

    image = tmp_path / "photo.png"
    Image.fromarray(_pixels(5, size=80)[0].astype("uint8")).save(image)
    assert main(["predict", "vit_tiny_patch16_224.augreg_in21k_ft_in1k", str(image), "--json"]) == 0
    (printed,) = json.loads(capsys.readouterr().out)
    classes = [answer["class"] for answer in printed["top_k"]]
    assert len(classes) == 5 and set(classes) <= set(pretrained.label_set("imagenet-1k"))


@pytest.fixture
def bad_repos(tiny_timm):
    """A repo with no weights, and a timm repo of another architecture (a ResNet)."""
    folder = _timm_repo("tests/no-weights", tiny_timm, safe_serialization=True)
    os.remove(os.path.join(folder, "model.safetensors"))
    torch.manual_seed(3)
    _timm_repo("tests/resnet", timm.create_model("resnet10t", pretrained=False, num_classes=3))


def _one_line_error(capsys, *argv):
    assert main(["predict", *argv]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("keras-vit predict: error: "), line
    return line


@pytest.mark.parametrize(
    "name, expected",
    [
        ("vit_tiny_patch16_224.nope", "vit_tiny_patch16_224's tags are vit_tiny_patch16_224.augreg_in21k,"),
        ("vit_tny_patch16_224", "did you mean vit_tiny_patch16_224"),
        ("hf-hub:tests/not-there", "No repo tests/not-there on http://127.0.0.1:"),
        ("hf-hub:tests/tiny-vit@v9", "tests/tiny-vit has no revision 'v9'"),
        ("hf-hub:tests/no-weights", "has none of model.safetensors, pytorch_model.bin"),
        ("hf-hub:tests/resnet", "holds a resnet10t, an architecture keras-vit does not build"),
    ],
)
def test_a_name_that_gives_no_vit_is_one_line_naming_it(
    name, expected, bad_repos, tiny_timm, hub_cache, tmp_path, capsys
):
    _timm_repo("tests/tiny-vit", tiny_timm, safe_serialization=True)
    line = _one_line_error(capsys, name, str(tmp_path / "any.png"))
    assert expected in line, line


@pytest.fixture
def unwaited_retries(monkeypatch):
    """huggingface_hub retries a refused or broken connection five times, waiting 23 s in all:
    here the same retries, without the waits."""
    import time
    import types

    from huggingface_hub.utils import _http as http_stack

    monkeypatch.setattr(http_stack, "time", types.SimpleNamespace(sleep=lambda seconds: None, time=time.time))


def test_offline_with_an_empty_cache_and_the_network_down_say_so_and_then_work(
    tiny_timm, hub_cache, unwaited_retries, tmp_path, capsys, monkeypatch
):
    from huggingface_hub import constants

    _timm_repo("tests/tiny-vit", tiny_timm, safe_serialization=True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    line = _one_line_error(capsys, "hf-hub:tests/tiny-vit", str(tmp_path / "any.png"))
    assert "is not in the cache" in line and "HF_HUB_OFFLINE" in line, line
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with _network_down():
        line = _one_line_error(capsys, "hf-hub:tests/tiny-vit", str(tmp_path / "any.png"))
    assert f"Cannot reach {HUB.url}" in line and "check the network" in line, line
    assert keras_vit.create_model("hf-hub:tests/tiny-vit", pretrained=True).num_classes == 5


def test_a_python_session_that_was_told_the_hub_is_down_tries_again_once_it_is_back(
    tiny_timm, hub_cache, unwaited_retries
):
    """One process, as a notebook: told "Cannot reach ..., then run the same command again", the
    user fixes the network and runs it again at once; keras-vit probes anew (it remembers whether
    the hub answered for 30 s, within one request), and loads."""
    from keras_vit.model import hub

    _timm_repo("tests/tiny-vit-back", tiny_timm, safe_serialization=True)
    with _network_down():
        with pytest.raises(hub.Unreachable, match="Cannot reach"):
            keras_vit.create_model("hf-hub:tests/tiny-vit-back", pretrained=True)
        left = dict(hub._answers)  # what the failed call left remembered
    assert left.get(hub._endpoint(), (None,))[0] is not False  # no "down" for the retry to repeat
    hub._answers.clear()
    hub._answers.update(left)  # as the failed call left it (_network_down forgets at its end)
    assert keras_vit.create_model("hf-hub:tests/tiny-vit-back", pretrained=True).num_classes == 5


def test_a_cached_model_on_a_down_network_costs_one_probe_however_often_a_request_reads_it(
    tiny_timm, hub_cache, monkeypatch
):
    """`keras-vit train --weights NAME` reads the name's config for its settings, then its config
    and weights as the run builds: on a down network each read falls back to the cache, after
    the one probe that found the hub down (3 s each where the network ignores connections)."""
    import types

    from keras_vit.model import hub, registry

    name = "hf-hub:tests/tiny-vit-cached"
    _timm_repo("tests/tiny-vit-cached", tiny_timm, safe_serialization=True)
    keras_vit.create_model(name, pretrained=True)  # now in the cache
    probes = []

    def create_connection(*args, **kwargs):
        probes.append(args)
        return socket.create_connection(*args, **kwargs)

    socket = hub.socket
    monkeypatch.setattr(hub, "socket", types.SimpleNamespace(create_connection=create_connection))
    with _network_down():
        for _ in range(2):  # the settings, then the run's build
            source = pretrained.resolve(name)
            assert registry.read_hub_model(source).num_classes == 5
            assert os.path.isfile(source.weights())
    assert len(probes) == 1


def test_a_download_cut_off_or_stopped_by_a_full_disk_is_one_line_and_the_next_try_works(
    imagenet_vit_ti, small_disk, unwaited_retries, monkeypatch, tmp_path, capsys
):
    """ViT-Ti's 23 MB of weights on a 12 MB disk, then over a connection that drops halfway:
    one line each time, and once there is room and network, the same name loads."""
    from huggingface_hub import constants

    name = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(small_disk / "cache"))
    line = _one_line_error(capsys, name, str(tmp_path / "any.png"))
    assert line.startswith(f"keras-vit predict: error: No space left in the model cache {small_disk}"), line
    assert "the download resumes" in line, line

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    HUB.cut_files.add("model.safetensors")
    try:
        line = _one_line_error(capsys, name, str(tmp_path / "any.png"))
    finally:
        HUB.cut_files.clear()
    assert "The download of model.safetensors of timm/vit_tiny_patch16_224" in line, line
    assert "broke off" in line and "it resumes where it stopped" in line, line
    assert len(keras_vit.create_model(name, pretrained=True).class_names) == 1000


def test_a_gated_repo_is_one_line_naming_hf_token_and_loads_once_it_is_set(
    tiny_timm, hub_cache, tmp_path, capsys, monkeypatch
):
    from huggingface_hub import constants

    _timm_repo("tests/gated-vit", tiny_timm, safe_serialization=True)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))  # nor `hf auth login`'s
    HUB.gated["tests/gated-vit"] = "hf_test_token"
    try:
        line = _one_line_error(capsys, "hf-hub:tests/gated-vit", str(tmp_path / "any.png"))
        assert "tests/gated-vit is gated: accept its terms on the hub, then set HF_TOKEN" in line, line
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        model = keras_vit.create_model("hf-hub:tests/gated-vit", pretrained=True)
    finally:
        HUB.gated.clear()
    assert model.num_classes == 5


def test_a_download_in_a_terminal_shows_huggingface_hubs_progress_bar(tiny_timm, hub_cache, tmp_path):
    """In a terminal (a pseudo-terminal here) the download shows huggingface_hub's progress bar;
    in a pipe, as in the tests above, the command prints no bar."""
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios

    from PIL import Image

    _timm_repo("tests/tiny-vit", tiny_timm, model_config=LABELLED, safe_serialization=True)
    image = tmp_path / "photo.png"
    Image.fromarray(_pixels(7)[0].astype("uint8")).save(image)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    command = [sys.executable, "-m", "keras_vit", "predict", "hf-hub:tests/tiny-vit", str(image)]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as in a user's shell
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    shown = b""
    while chunk := _read_terminal(leader):
        shown += chunk
    os.close(leader)
    text = shown.decode(errors="replace")
    assert process.wait(timeout=HANG_SECONDS) == 0, text[-2000:]
    lines = [line for line in re.split(r"[\r\n]+", text) if line.strip()]
    bars = [line for line in lines if "model.safetensors:" in line or "config.json:" in line]
    assert any("model.safetensors: 100%|" in bar for bar in bars), text[-2000:]
    (answer,) = set(lines) - set(bars)  # and nothing else: no framework's log line
    assert re.fullmatch(rf"{re.escape(str(image))}: [a-e] [01]\.\d{{3}}, .*", answer), text[-2000:]


def _read_terminal(leader):
    try:
        return os.read(leader, 1 << 16)
    except OSError:  # EIO: the command ended and closed the terminal
        return b""


def test_evaluate_scores_an_imagenet_name_on_some_of_its_classes_in_folders_named_by_wordnet_id(
    imagenet_vit_ti, hub_cache, tmp_path, capsys
):
    """Imagenette's layout (val/<wnid>/...): the model chooses among the dataset's classes alone."""
    from PIL import Image

    wnids = ["n01440764", "n02102040"]  # tench and English springer, two of Imagenette's classes
    pixels = np.concatenate([_pixels(10 + k, size=224) for k in range(2)]).round()
    for i, image in enumerate(pixels):
        folder = tmp_path / "imagenette" / "val" / wnids[i // 2]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.astype("uint8")).save(folder / f"{i}.png")
    name = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    argv = ["evaluate", name, "--dataset", str(tmp_path / "imagenette"), "--output", str(tmp_path / "report")]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model_classes"] == 1000 and result["count"] == 4 and list(result["per_class"]) == wnids
    imagenet = pretrained.wordnet_ids(pretrained.label_set("imagenet-1k"))
    # timm's answers with its own evaluation transform (the checkpoint's: bicubic to 248, crop 224).
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=imagenet_vit_ti))
    photos = sorted((tmp_path / "imagenette" / "val").rglob("*.png"))
    with torch.no_grad():
        logits = imagenet_vit_ti.eval()(
            torch.stack([transform(Image.open(p).convert("RGB")) for p in photos])
        )
    chosen = logits.numpy()[:, [imagenet.index(wnid) for wnid in wnids]].argmax(axis=1)
    assert result["top1"] == np.mean(chosen == [0, 0, 1, 1]) and result["top5"] == 1.0
    assert (tmp_path / "report" / "evaluation.json").exists()


# The embedded ViT-Ti: byte for byte the real checkpoint of ../shared/pretrained (its README's sha256).
EMBEDDED_VIT_TI = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
EMBEDDED_SHA256 = "3f1f07da5e1337265ac1eb0234d13841467caf730b3c4240bd3f98c49bc16a92"


def test_the_embedded_vit_ti_is_the_real_checkpoint_with_its_licence_and_provenance():
    import hashlib

    folder = os.path.join(pretrained.EMBEDDED, EMBEDDED_VIT_TI)
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == EMBEDDED_SHA256
    shared_readme = os.path.join(
        os.path.dirname(os.path.dirname(__file__)), "..", "..", "shared", "pretrained"
    )
    if os.path.isdir(shared_readme):  # the provenance's own record, where it is beside the checkout
        with open(os.path.join(shared_readme, "README.md")) as f:
            assert EMBEDDED_SHA256 in f.read()
    with open(os.path.join(folder, "config.json")) as f:
        assert json.load(f)["pretrained_cfg"]["license"] == "apache-2.0"
    with open(os.path.join(pretrained.EMBEDDED, "README.md")) as f:
        notes = f.read()
    assert EMBEDDED_SHA256 in notes and "Apache-2.0" in notes and "codr-shiv/VisionTransformer" in notes
    with open(os.path.join(pretrained.EMBEDDED, "LICENSE")) as f:
        assert "Apache License" in f.read()


@pytest.fixture
def counted_retries(monkeypatch):
    """huggingface_hub's waits between retries, recorded instead of waited."""
    import time
    import types

    from huggingface_hub.utils import _http as http_stack

    waits = []
    monkeypatch.setattr(http_stack, "time", types.SimpleNamespace(sleep=waits.append, time=time.time))
    return waits


@pytest.fixture(autouse=True)
def _unannounced(monkeypatch):
    """Each test starts as a new process: no embedded copy said yet."""
    monkeypatch.setattr(pretrained, "_announced", set())


@contextlib.contextmanager
def _network_down():
    """The stand-in hub stopped, then serving again. keras-vit remembers for 30 s whether the hub
    answered (`hub.endpoint_answers`): forgotten at both ends, or a test that starts within 30 s of
    a probe would see the network as it was then (up while down, or down for the tests after)."""
    HUB.stop()
    pretrained.hub._answers.clear()
    try:
        yield
    finally:
        HUB.start()
        pretrained.hub._answers.clear()


@pytest.fixture
def hub_down():
    with _network_down():
        yield


def _embedded_notice(caplog):
    return [r.getMessage() for r in caplog.records if "copy shipped inside keras-vit" in r.getMessage()]


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", EMBEDDED_VIT_TI])
def test_an_unreachable_hub_gives_the_embedded_vit_ti_for_its_names_at_once_and_says_so(
    name, hub_cache, hub_down, counted_retries, caplog, tmp_path, capsys
):
    caplog.set_level("WARNING")
    model = keras_vit.create_model(name, pretrained=True)
    (notice,) = _embedded_notice(caplog)
    assert notice.startswith(f"{name} is not in the model cache and the hub cannot be reached"), notice
    keras_vit.create_model(name, pretrained=True, num_classes=3)
    assert len(_embedded_notice(caplog)) == 1  # said once a process
    assert model.num_classes == 1000 and model.class_names[0] == "tench, Tinca tinca"
    assert counted_retries == []  # the endpoint was asked once, not retried five times
    # Any other name: one line, no retries either.
    line = _one_line_error(capsys, "hf-hub:tests/tiny-vit", str(tmp_path / "any.png"))
    assert f"Cannot reach {HUB.url}" in line and "check the network" in line, line
    line = _one_line_error(capsys, "vit_small_patch16_224", str(tmp_path / "any.png"))
    assert f"Cannot reach {HUB.url}" in line, line
    assert counted_retries == []


def test_offline_mode_with_an_empty_cache_gives_the_embedded_vit_ti_and_a_reachable_hub_comes_first(
    hub_cache, caplog, monkeypatch
):
    from huggingface_hub import constants

    caplog.set_level("WARNING")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    keras_vit.create_model("vit_tiny_patch16_224", pretrained=True)
    (notice,) = _embedded_notice(caplog)
    assert "HF_HUB_OFFLINE is set" in notice, notice
    caplog.clear()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    serve_real_vit_ti()
    HUB.requests.clear()
    keras_vit.create_model("vit_tiny_patch16_224", pretrained=True)
    assert _embedded_notice(caplog) == []
    assert ("GET", f"/{REAL_VIT_TI}/resolve/main/model.safetensors") in HUB.requests, HUB.requests
