"""`keras-vit export NAME`: a pretrained model by name, exported and verified for agreement on
the images there are (the embedded ones here, which are not of its classes)."""

import json

import timm
import torch
from conftest import HUB
from timm.models import save_for_hf

from keras_vit.cli import main
from keras_vit.inference.runtimes import TFLiteRunner


def test_a_pretrained_name_exports_verified_for_agreement_on_the_embedded_images(hub_cache, tmp_path, capsys):
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, num_classes=4, img_size=32, patch_size=4, embed_dim=32,
        depth=1, num_heads=4, mlp_ratio=2.0,
    )  # fmt: skip
    save_for_hf(model, HUB.repo_folder("tests/export-me"), model_config={"label_names": list("wxyz")})
    argv = ["export", "hf-hub:tests/export-me", "--output", str(tmp_path), "--format", "saved_model,tflite"]
    assert main([*argv, "--quantize", "none", "--verify-images", "40", "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    report = manifest["verification"]
    assert manifest["source"] == "hf-hub:tests/export-me"
    assert report["dataset"] == "cifar10-mini" and report["count"] == 40
    assert report["keras_accuracy"] is None and report["passed"]
    for name in ("saved_model", "tflite_fp32"):
        assert report["results"][name]["accuracy"] is None
        assert report["results"][name]["top1_agreement"] == 1.0
    assert TFLiteRunner(f"{manifest['folder']}/model.tflite").class_names == list("wxyz")
    table = (tmp_path / "vit_tiny_patch16_224").rglob("verification.md")
    assert "agreement only" in next(table).read_text()
