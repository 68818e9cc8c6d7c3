"""The mobile classifier, driven in Debian's Chromium as a phone (Playwright, touch, small screen).

Every test image's top-1 in the page must equal LiteRT's top-1 in Python for the same model.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("playwright")

from conftest import HANG_SECONDS, NATIVE_LOG_LINE  # noqa: E402

from keras_vit.apps.mobile import browser, server  # noqa: E402
from keras_vit.apps.mobile.build import build_app, describe_model  # noqa: E402
from keras_vit.data.contract import InputContract  # noqa: E402
from keras_vit.inference.runtimes import TFLiteRunner  # noqa: E402
from keras_vit.model.transform import Transform  # noqa: E402
from keras_vit.storage.export_folder import INTEGER_VARIANTS  # noqa: E402

VENV_BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def model_path(export_folder):
    return os.path.join(export_folder["folder"], "model.tflite")


@pytest.fixture(scope="module")
def app_folder(model_path, tmp_path_factory):
    return build_app(model_path, tmp_path_factory.mktemp("mobile") / "app")


def _serve(folder):
    httpd = server.make_server(folder, "127.0.0.1", 0)
    server.serve_in_background(httpd)
    return httpd


@pytest.fixture(scope="module")
def app_url(app_folder):
    httpd = _serve(app_folder)
    yield server.urls(httpd)[0]
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def page(phone, app_url):
    context = phone.new_context()
    yield browser.open_app(context, app_url)
    context.close()


@pytest.fixture(scope="module")
def test_images(image_folder, tmp_path_factory):
    """The 20 CIFAR-10 PNGs, plus the same pictures in the shapes phones produce: larger and
    non-square (resized in the page), smaller (upsampled), with transparency, and a JPEG
    stored sideways with an EXIF orientation."""
    folder = tmp_path_factory.mktemp("phone_images")
    originals = sorted(image_folder.glob("*.png"))
    for path in originals:
        shutil.copy(path, folder / path.name)
    pictures = [Image.open(path).convert("RGB") for path in originals[:4]]
    pictures[0].resize((77, 51), Image.Resampling.BICUBIC).save(folder / "wide_77x51.png")
    pictures[1].resize((480, 640), Image.Resampling.BICUBIC).save(folder / "portrait_480x640.png")
    pictures[2].resize((20, 24), Image.Resampling.BICUBIC).save(folder / "small_20x24.png")
    transparent = pictures[3].convert("RGBA")
    alpha = np.full((32, 32), 255, np.uint8)
    alpha[8:24, 8:24] = 96
    transparent.putalpha(Image.fromarray(alpha))
    transparent.save(folder / "transparent.png")
    # Upright it is 60 x 90 (tall); stored 90 x 60 with orientation 6 ("rotate 90 clockwise").
    upright = pictures[0].resize((60, 90), Image.Resampling.BICUBIC)
    exif = Image.Exif()
    exif[0x0112] = 6
    upright.transpose(Image.Transpose.ROTATE_90).save(folder / "sideways.jpg", quality=95, exif=exif)
    return sorted(folder.iterdir())


def _python_litert(model_path, image_path):
    """LiteRT in Python, with the library's own image reading: (input pixels, probabilities)."""
    runner = TFLiteRunner(model_path)
    pixels = InputContract.of(runner).read(image_path)
    return pixels, runner.predict([pixels])[0]


def test_top1_equals_python_litert_on_every_test_image(page, model_path, test_images, record_parity):
    labels = describe_model(model_path)["labels"]
    worst_input, worst_probability = 0.0, 0.0
    for path in test_images:
        result = browser.classify(page, path)
        assert result["error"] is None, path.name
        predictions = result["predictions"]
        pixels, probabilities = _python_litert(model_path, path)
        assert len(predictions) == 5
        assert predictions[0]["name"] == labels[int(np.argmax(probabilities))], path.name
        # The rest of the top 5, in rank order, with the probability shown as text.
        expected = [labels[i] for i in np.argsort(-probabilities)[:5]]
        assert [p["name"] for p in predictions] == expected, path.name
        for prediction in predictions:
            assert f"{100 * prediction['probability']:.1f}%" in prediction["text"]
        page_pixels = np.asarray(page.evaluate("Array.from(window.kerasVit.lastInput)"), np.float32)
        page_probabilities = np.asarray(page.evaluate("Array.from(window.kerasVit.lastProbabilities)"))
        if path.suffix == ".png":
            # Same decoded pixels and the same resize filter as TensorFlow's.
            worst_input = max(worst_input, np.abs(page_pixels - pixels.reshape(-1)).max())
            worst_probability = max(worst_probability, np.abs(page_probabilities - probabilities).max())
        else:
            # JPEG: Chromium's and Pillow's decoders may round a few values differently.
            assert np.abs(page_pixels - pixels.reshape(-1)).mean() < 1.0
    assert record_parity("mobile app vs Python: model input pixels (0-255), PNG", worst_input, 1e-2) < 1e-2
    assert record_parity("mobile app vs Python LiteRT: probabilities, PNG", worst_probability, 1e-5) < 1e-5
    assert "ms" in page.text_content("[data-testid=timing]")


@pytest.mark.parametrize("variant", INTEGER_VARIANTS)
def test_an_integer_model_gives_litert_s_top5_in_the_page(
    phone, export_folder, image_folder, variant, tmp_path
):
    """The integer variants run in LiteRT.js too: the page quantises its pixels as the model says
    and dequantises the probabilities. Against Python's LiteRT fed the page's own input, the top 5
    are the same and the probabilities within two steps of the model's output quantisation (the
    browser's int8 and int16 kernels may round a last step or two apart from the native ones);
    `int8`, whose products run int8 by int8 on float activations quantised at run time, gives float
    probabilities, within 1e-4 of LiteRT's."""
    path = os.path.join(export_folder["folder"], f"model_{variant}.tflite")
    runner = TFLiteRunner(path)
    step = _output_step(path)
    assert 0 < step <= 1 / 256 or (variant == "int8" and step == 0)
    tolerance = 2 * step + 1e-6 if step else 1e-4
    httpd = _serve(build_app(path, tmp_path / "app"))
    context = phone.new_context()
    try:
        page = browser.open_app(context, server.urls(httpd)[0])
        assert describe_model(path)["input"]["dtype"] == "uint8"
        worst = 0.0
        for image in sorted(image_folder.glob("*.png")):
            result = browser.classify(page, image)
            assert result["error"] is None, image.name
            pixels = np.asarray(page.evaluate("Array.from(window.kerasVit.lastInput)"), np.float32)
            shown = np.asarray(page.evaluate("Array.from(window.kerasVit.lastProbabilities)"))
            expected = runner.predict([pixels.reshape(*runner.image_size, 3)])[0]
            top5 = [runner.class_names.index(p["name"]) for p in result["predictions"]]
            assert top5 == list(np.argsort(-shown, kind="stable")[:5]), image.name
            # Python's top 5, up to classes that the steps of quantisation apart may swap.
            assert np.abs(expected[top5] - np.sort(expected)[::-1][:5]).max() <= tolerance, image.name
            worst = max(worst, float(np.abs(shown - expected).max()))
    finally:
        context.close()
        httpd.shutdown()
        httpd.server_close()
    assert worst <= tolerance, worst


def _output_step(path):
    """The probabilities' quantisation step: the output's scale, or the final softmax's."""
    from keras_vit.export import tflite_graph

    with open(path, "rb") as f:
        return tflite_graph.output_step(f.read())


@pytest.fixture(scope="module")
def gpu_phone(phone):
    with phone.with_webgpu() as opened:
        yield opened


def test_on_a_gpu_the_app_checks_it_then_gives_the_cpus_answers(
    gpu_phone, app_url, model_path, test_images, record_parity
):
    """Chromium's software WebGPU adapter (SwiftShader) stands in for a phone's GPU: the app
    checks the GPU against WebAssembly on its test image, takes it, and on every test image
    gives the CPU's top 5 in the same order and its probabilities."""
    context = gpu_phone.new_context()
    try:
        page = browser.open_app(context, app_url)
        assert page.evaluate("window.kerasVit.accelerator") == "webgpu", page.text_content("#status")
        check = page.evaluate("window.kerasVit.gpuCheck")
        assert check["agree"] and check["sameTopK"] and check["maxDifference"] <= 1e-3
        assert "LiteRT.js on GPU (WebGPU)" in page.text_content("#status")
        worst = 0.0
        for path in test_images:
            assert browser.classify(page, path)["error"] is None, path.name
            on_gpu = np.asarray(page.evaluate("Array.from(window.kerasVit.lastProbabilities)"))
            on_cpu = _python_litert(model_path, path)[1]  # LiteRT's CPU, as WebAssembly gives it (above)
            assert list(np.argsort(-on_gpu)[:5]) == list(np.argsort(-on_cpu)[:5]), path.name
            worst = max(worst, np.abs(on_gpu - on_cpu).max())
    finally:
        context.close()
    assert (
        record_parity("mobile app on WebGPU (SwiftShader) vs LiteRT CPU: probabilities", worst, 1e-3) <= 1e-3
    )


def test_a_gpu_that_disagrees_with_the_cpu_is_not_used_and_the_page_says_so(gpu_phone, app_url, test_images):
    """A disagreement forced by serving app.js with a tolerance no answer can meet: the app stays
    on WebAssembly, says why, and classifies."""
    context = gpu_phone.new_context(service_workers="block")  # every file from the server, routed

    def strict_app_js(route):
        source = route.fetch().text()
        assert "const GPU_TOLERANCE = 1e-3;" in source
        route.fulfill(body=source.replace("const GPU_TOLERANCE = 1e-3;", "const GPU_TOLERANCE = -1;"),
                      content_type="text/javascript")  # fmt: skip

    try:
        context.route("**/app.js", strict_app_js)
        page = browser.open_app(context, app_url)
        assert page.evaluate("window.kerasVit.accelerator") == "wasm"
        assert page.evaluate("window.kerasVit.gpuCheck.agree") is False
        status = page.text_content("#status")
        assert (
            "LiteRT.js on CPU (WebAssembly) (the GPU gave other answers than the CPU on a test image)"
            in status
        )
        assert browser.classify(page, test_images[0])["error"] is None
    finally:
        context.close()


def test_the_page_reads_what_the_model_says(page, model_path):
    description = describe_model(model_path)
    assert page.evaluate("window.kerasVit.info.labels") == description["labels"]
    contract = InputContract.of(TFLiteRunner(model_path))
    assert description["labels"] == contract.class_names and description["imageSize"] == [32, 32]
    status = page.text_content("[data-testid=status]")
    assert "10 classes" in status and "32×32" in status and "LiteRT.js" in status
    assert page.text_content("h1") == description["name"]


def test_offline_after_the_first_visit(phone, app_folder, model_path, test_images):
    """With the server gone, the installed app still opens, loads its model and classifies."""
    httpd = _serve(app_folder)
    url = server.urls(httpd)[0]
    context = phone.new_context()
    try:
        page = browser.open_app(context, url)
        browser.wait_until_offline_ready(page)
        precache = page.evaluate(
            "caches.keys().then(keys => caches.open(keys[0])).then(c => c.keys())"
            ".then(requests => requests.map(r => new URL(r.url).pathname))"
        )
        assert {"/", "/model.tflite", "/model.json", "/vendor/@litertjs/core/dist/index.js"} <= set(precache)
        httpd.shutdown()
        httpd.server_close()
        context.set_offline(True)
        page.reload()
        page.wait_for_function("document.body.dataset.state", timeout=browser.LOAD_TIMEOUT_MS)
        assert page.evaluate("document.body.dataset.state") == "ready"
        path = test_images[0]
        result = browser.classify(page, path)
        _, probabilities = _python_litert(model_path, path)
        labels = describe_model(model_path)["labels"]
        assert result["predictions"][0]["name"] == labels[int(np.argmax(probabilities))]
    finally:
        context.close()
        httpd.server_close()


def test_an_undecodable_image_gets_a_message_and_the_app_goes_on(page, tmp_path, test_images):
    broken = tmp_path / "holiday.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 this is not really a JPEG")
    result = browser.classify(page, broken)
    assert "holiday.jpg could not be decoded" in result["error"]
    assert result["predictions"] == []
    result = browser.classify(page, test_images[0])
    assert result["error"] is None and len(result["predictions"]) == 5


def test_a_model_that_fails_to_load_gets_a_message(phone, app_folder, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(app_folder, broken)
    (broken / "model.tflite").write_bytes(b"TFL3 but not a flatbuffer at all" * 10)
    missing = tmp_path / "missing"
    shutil.copytree(app_folder, missing)
    (missing / "model.json").unlink()
    other_resize = tmp_path / "other_resize"  # a model.json from a keras-vit whose resize rule differs
    shutil.copytree(app_folder, other_resize)
    description = json.loads((other_resize / "model.json").read_text())
    (other_resize / "model.json").write_text(json.dumps(dict(description, resize="nearest")))
    cases = (
        (broken, "model.tflite could not be loaded by LiteRT.js"),
        (missing, "HTTP 404"),
        (other_resize, 'model.json asks for the resize "nearest"'),
    )
    for folder, expected in cases:
        httpd = _serve(folder)
        context = phone.new_context()
        try:
            page = browser.open_app(context, server.urls(httpd)[0])
            assert page.evaluate("document.body.dataset.state") == "failed"
            error = page.text_content("[data-testid=error]")
            assert error.startswith("The model failed to load") and expected in error
            assert page.is_disabled("#gallery-input") and page.is_disabled("#live-button")
        finally:
            context.close()
            httpd.shutdown()
            httpd.server_close()


def test_live_camera_classifies_frames_until_stopped(page):
    page.tap("#live-button")
    page.wait_for_function("window.kerasVit.live && window.kerasVit.live.frames >= 3", timeout=60_000)
    assert page.get_attribute("#live-button", "aria-pressed") == "true"
    assert len(page.query_selector_all("[data-testid=prediction]")) == 5
    page.tap("#live-button")
    assert page.evaluate("window.kerasVit.live") is None
    assert page.get_attribute("#live-button", "aria-pressed") == "false"
    assert page.is_hidden("#camera")


def test_installable_and_usable_with_one_hand(page, app_url, app_folder):
    browser.wait_until_offline_ready(page)
    devtools = page.context.new_cdp_session(page)
    assert devtools.send("Page.getAppManifest")["errors"] == []
    # Chromium's own install check; Playwright's contexts are incognito, which alone blocks it.
    errors = devtools.send("Page.getInstallabilityErrors")["installabilityErrors"]
    assert [e["errorId"] for e in errors if e["errorId"] != "in-incognito"] == []
    manifest = json.loads((app_folder / "manifest.webmanifest").read_text())
    assert manifest["display"] == "standalone" and manifest["start_url"] == "./"
    for icon in manifest["icons"]:
        with Image.open(app_folder / icon["src"]) as picture:
            assert f"{picture.width}x{picture.height}" == icon["sizes"]
    assert {"192x192", "512x512"} <= {icon["sizes"] for icon in manifest["icons"]}
    assert page.evaluate("navigator.maxTouchPoints") > 0  # a touch phone
    viewport = page.viewport_size
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]  # no sideways scroll
    for selector in ("#take-photo", "#pick-photo", "#live-button"):
        box = page.locator(selector).bounding_box()
        assert box["height"] >= 48 and box["width"] >= 96  # thumb-sized
        assert box["y"] > viewport["height"] * 0.75  # within a thumb's reach
    assert page.get_attribute("#capture-input", "capture") == "environment"
    assert page.get_attribute("#gallery-input", "accept") == "image/*"


def test_everything_is_served_locally(page, app_folder):
    hosts = page.evaluate("performance.getEntriesByType('resource').map(e => new URL(e.name).host)")
    assert hosts and set(hosts) == {page.url.split("/")[2]}
    text = "".join(p.read_text() for p in app_folder.glob("*.html")) + (app_folder / "app.js").read_text()
    assert "cdn" not in text.lower() and "https://" not in text


@pytest.mark.parametrize(
    "transform",
    [Transform(), Transform(0.9, "center", "bicubic"), Transform(0.875, "squash", "bicubic")],
    ids=["plain", "timm-vit", "squash-crop"],
)
def test_the_page_resize_is_the_input_contracts(tmp_path, transform):
    """preprocess.js alone, in node: its resize is the contract's rule, by name and to the bit,
    for every evaluation transform model.json can carry."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    from keras_vit.apps.mobile.build import WEB
    from keras_vit.data.contract import RESIZE

    rng = np.random.default_rng(0)
    for height, width, out_height, out_width in ((61, 77, 32, 32), (480, 640, 224, 224), (20, 13, 32, 48)):
        rgba = rng.integers(0, 256, (height, width, 4), np.uint8)
        rgba.tofile(tmp_path / "in.bin")
        script = tmp_path / "resize.mjs"
        script.write_text(
            f"import {{RESIZE, resizeRgba}} from '{(WEB / 'preprocess.js').as_uri()}';\n"
            "import fs from 'fs';\n"
            f"const rgba = new Uint8Array(fs.readFileSync('{tmp_path / 'in.bin'}'));\n"
            f"const transform = {json.dumps(transform.config())};\n"
            f"const out = resizeRgba(rgba, {width}, {height}, {out_width}, {out_height}, transform);\n"
            f"fs.writeFileSync('{tmp_path / 'out.bin'}', Buffer.from(out.buffer));\n"
            "console.log(RESIZE);\n"
        )
        ported = subprocess.run(["node", str(script)], check=True, capture_output=True, text=True)
        assert ported.stdout.strip() == RESIZE
        page_resized = np.fromfile(tmp_path / "out.bin", np.float32).reshape(out_height, out_width, 3)
        expected = InputContract((out_height, out_width), transform=transform).resize(rgba[..., :3])
        np.testing.assert_array_equal(page_resized, expected)


def test_describe_model_refuses_what_the_app_cannot_run(tmp_path, export_folder):
    from keras_vit.export import metadata, tflite
    from keras_vit.inference.classifier import load_classifier

    with pytest.raises(FileNotFoundError, match="Model not found"):
        describe_model(tmp_path / "nowhere.tflite")
    text_file = tmp_path / "notes.tflite"
    text_file.write_text("not a model")
    with pytest.raises(ValueError, match="not a TFLite model"):
        describe_model(text_file)
    classifier = load_classifier(export_folder["source"])
    bare = tmp_path / "bare.tflite"
    bare.write_bytes(tflite.convert(classifier, "fp32"))
    with pytest.raises(ValueError, match="has no metadata"):
        describe_model(bare)
    dynamic = tmp_path / "dynamic.tflite"  # batch -1, as model.export(format="litert") writes
    dynamic.write_bytes(metadata.add_metadata(_dynamic_batch_tflite(classifier, tmp_path), classifier))
    with pytest.raises(ValueError, match=r"static \[1, height, width, 3\]"):
        describe_model(dynamic)


def _dynamic_batch_tflite(classifier, tmp_path):
    import keras
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(classifier.model)
    spec = tf.TensorSpec([None, 32, 32, 3], tf.float32, name="images")
    archive.add_endpoint("serving_default", lambda x: {"probabilities": classifier.probabilities(x)}, [spec])
    archive.write_out(str(tmp_path / "dynamic_saved_model"), verbose=False)
    return tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "dynamic_saved_model")).convert()


def test_build_replaces_its_own_output_but_never_a_users_folder(model_path, tmp_path):
    folder = build_app(model_path, tmp_path / "app")
    first = (folder / "sw.js").read_text()
    assert build_app(model_path, tmp_path / "app") == folder and (folder / "sw.js").read_text() == first
    precache = json.loads(first.split("const PRECACHE = ", 1)[1].split(";\n", 1)[0])
    listed = {name for name in precache["files"] if name != "./"}
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"sw.js"}
    assert listed == on_disk  # the cache holds every file the app has
    documents = tmp_path / "documents"
    documents.mkdir()
    (documents / "thesis.txt").write_text("precious")
    with pytest.raises(ValueError, match="not a mobile app build"):
        build_app(model_path, documents)
    assert (documents / "thesis.txt").read_text() == "precious"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_cli_screenshot_and_clear_errors(model_path, test_images, tmp_path, phone):
    command = [os.path.join(VENV_BIN, "keras-vit"), "app", "mobile", "--model"]
    out = tmp_path / "phone.png"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}  # as a user's shell has it
    done = subprocess.run(
        [*command, model_path, "--screenshot", str(out), "--image", str(test_images[0])],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not re.search(NATIVE_LOG_LINE, done.stderr), done.stderr  # no TensorFlow, absl or LiteRT line
    with Image.open(out) as picture:
        assert picture.width < picture.height  # a phone's portrait screen
    for arguments, message in (
        ([str(tmp_path / "nowhere.tflite")], "Model not found"),
        ([model_path, "--build-only"], "--build-only needs --output"),
        ([model_path, "--screenshot", str(out)], "--screenshot needs --image"),
    ):
        failed = subprocess.run([*command, *arguments], capture_output=True, text=True, timeout=HANG_SECONDS)
        assert failed.returncode == 1 and message in failed.stderr
        assert "Traceback" not in failed.stderr


def test_server_types_https_and_clear_errors(app_folder, tmp_path):
    import ssl
    import urllib.request

    httpd = _serve(app_folder)
    try:
        base = server.urls(httpd)[0]
        wasm = base + "vendor/@litertjs/core/wasm/litert_wasm_internal.wasm"
        with urllib.request.urlopen(wasm) as response:
            assert response.headers["Content-Type"] == "application/wasm"  # instantiateStreaming needs it
        with urllib.request.urlopen(base + "manifest.webmanifest") as response:
            assert response.headers["Content-Type"] == "application/manifest+json"
        with pytest.raises(ValueError, match="pass another --port"):
            server.make_server(app_folder, "127.0.0.1", httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()

    with pytest.raises(ValueError, match="Cannot use the certificate"):
        server.make_server(app_folder, "127.0.0.1", 0, certfile=str(tmp_path / "missing.pem"))
    if shutil.which("openssl") is None:
        return
    certificate, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-keyout", str(key), "-out", str(certificate)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    httpd = server.make_server(app_folder, "127.0.0.1", 0, certfile=str(certificate), keyfile=str(key))
    server.serve_in_background(httpd)
    try:
        url = server.urls(httpd)[0]
        assert url.startswith("https://localhost:")
        context = ssl.create_default_context(cafile=str(certificate))
        with urllib.request.urlopen(url + "model.json", context=context) as response:
            served = json.loads(response.read())
        assert served["labels"] == describe_model(app_folder / "model.tflite")["labels"]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_front_end_installs_once_into_the_users_cache(tmp_path, monkeypatch):
    """`npm ci` runs in a staging folder of the cache, renamed into place; a second build reuses it."""
    from keras_vit.apps.mobile import build

    installed = build.ensure_front_end()  # the suite's own cache, filled by scripts/setup.sh
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    calls = tmp_path / "npm-calls"
    (fake_bin / "npm").write_text(f'#!/bin/sh\necho "$PWD" >> {calls}\ncp -r {installed} ./node_modules\n')
    (fake_bin / "npm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    node_modules = build.ensure_front_end()
    assert node_modules == build.front_end_folder() / "node_modules"
    assert node_modules.is_relative_to(tmp_path / "cache" / "keras-vit")
    assert build.ensure_front_end() == node_modules
    assert len(calls.read_text().splitlines()) == 1  # installed once, in a staging folder
    assert os.listdir(node_modules.parent.parent) == [node_modules.parent.name]  # no staging left


def test_the_app_takes_litert_js_from_the_packages_own_copy_while_it_matches_the_lock(tmp_path, monkeypatch):
    """A wheel's vendor/ comes before the npm cache; a copy left from another lock is passed over."""
    from keras_vit.apps.mobile import build, front_end

    packaged = front_end.vendor(build.ensure_front_end(), tmp_path / "vendor")
    monkeypatch.setattr(front_end, "PACKAGED", packaged)
    assert build.front_end() == packaged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vendor"]  # no staging left
    manifest = packaged / "@litertjs" / "core" / "package.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "version": "0.0.1"}))
    assert build.front_end() == build.ensure_front_end()


def test_vendoring_an_incomplete_front_end_is_one_line_and_writes_nothing(tmp_path):
    from keras_vit.apps.mobile import build, front_end

    partial = tmp_path / "node_modules"
    shutil.copytree(build.ensure_front_end(), partial)
    (partial / front_end.VENDOR_FILES[-1]).write_bytes(b"")  # as npm leaves a full disk
    with pytest.raises(ValueError, match=r"does not hold LiteRT.js as .*package-lock.json pins it"):
        front_end.vendor(partial, tmp_path / "vendor")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node_modules"]


def test_a_non_editable_install_builds_the_app_without_npm_or_writing_into_the_package(model_path, tmp_path):
    """pip install . (not -e) into a fresh venv: the app builds from the LiteRT.js the wheel
    carries (an empty cache, and an npm that fails if called), and the package's files are unchanged."""
    import sysconfig
    from pathlib import Path

    from keras_vit.apps.mobile import build

    source = tmp_path / "source"
    shutil.copytree(
        Path(__file__).resolve().parents[2],  # the repository
        source,
        ignore=shutil.ignore_patterns(
            ".*", "node_modules", "vendor", "runs", "exports", "build", "*.egg-info", "__pycache__"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            tmp_path / "wheel",
            source,
        ],
        check=True,
    )
    venv = tmp_path / "venv"
    # No pip of its own (bootstrapping one costs seconds): the suite's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    wheel = next((tmp_path / "wheel").glob("keras_vision_transformers-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
        check=True,
    )
    site = subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    # keras-vit's dependencies come from the suite's environment, after the venv's own site-packages.
    (Path(site) / "suite_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    package = Path(site) / "keras_vit"

    def snapshot():
        return {
            p.relative_to(package).as_posix(): p.stat().st_mtime_ns
            for p in package.rglob("*")
            if "__pycache__" not in p.parts
        }

    before = snapshot()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "npm").write_text("#!/bin/sh\necho npm was called >&2\nexit 1\n")
    (fake_bin / "npm").chmod(0o755)
    result = subprocess.run(
        [
            python,
            "-m",
            "keras_vit",
            "app",
            "mobile",
            "--model",
            model_path,
            "--build-only",
            "--output",
            tmp_path / "app",
        ],
        env=dict(
            os.environ, XDG_CACHE_HOME=str(tmp_path / "empty-cache"), PATH=f"{fake_bin}:{os.environ['PATH']}"
        ),
        cwd=tmp_path,  # not the source tree, which would shadow the installed package
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    where = subprocess.check_output(
        [python, "-c", "import keras_vit.apps.mobile.build as b; print(b.__file__)"], text=True, cwd=tmp_path
    )
    assert where.startswith(str(package))
    for name in build.VENDOR_FILES:
        assert (tmp_path / "app" / "vendor" / name).read_bytes() == (
            package / "apps/mobile/vendor" / name
        ).read_bytes()
    assert not (tmp_path / "empty-cache" / "keras-vit").exists()
    assert snapshot() == before and not (package / "apps" / "mobile" / "node_modules").exists()
