"""`keras-vit app mobile`: builds the offline web app for a `.tflite` and serves it to phones."""

import os
import tempfile
from pathlib import Path

from keras_vit.apps.mobile import build, server
from keras_vit.storage.locate import locate


def resolve_model(path):
    """The `.tflite` to ship for `path`: a `.tflite` file, or an export folder holding one."""
    located = locate(path)
    if located.kind != "tflite":
        raise ValueError(
            f"{path} is a {located.kind} model; the phone app runs a .tflite: pass the .tflite or "
            f"the export folder that `keras-vit export` wrote."
        )
    return Path(located.path)


def run(
    model,
    host="127.0.0.1",
    port=8000,
    output=None,
    build_only=False,
    certfile=None,
    keyfile=None,
    screenshot=None,
    image=None,
):
    """Builds the app for `model` and serves it until Ctrl+C (or only builds, or screenshots it).

    Returns:
        The exit status.
    """
    if screenshot and not image:
        raise ValueError("--screenshot needs --image, the picture to classify in it.")
    if build_only and not output:
        raise ValueError("--build-only needs --output, the folder to write the app to.")
    if keyfile and not certfile:
        raise ValueError("--keyfile needs --certfile.")
    if image and not os.path.isfile(image):
        raise FileNotFoundError(f"Image not found: {image}")
    model_path = resolve_model(model)
    with tempfile.TemporaryDirectory(prefix="keras-vit-mobile-") as scratch:
        folder = build.build_app(model_path, output or Path(scratch) / "app")
        print(f"Built the app for {model_path} in {folder}")
        if build_only:
            return 0
        if screenshot:
            return _screenshot(folder, image, screenshot)
        return _serve(folder, host, port, certfile, keyfile)


def _screenshot(folder, image, output):
    from keras_vit.apps.mobile.browser import screenshot
    from keras_vit.files import atomic_write

    httpd = server.make_server(folder, "127.0.0.1", 0)
    server.serve_in_background(httpd)
    try:
        result = {}
        atomic_write(
            output, lambda temporary: result.update(screenshot(server.urls(httpd)[0], image, temporary))
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
    top = result["predictions"][0]
    print(f"{image}: {top['name']} {top['probability']:.1%}; screenshot saved to {output}")
    return 0


def _serve(folder, host, port, certfile, keyfile):
    httpd = server.make_server(folder, host, port, certfile, keyfile, verbose=True)
    addresses = server.urls(httpd)
    print("Serving the mobile classifier at:")
    for address in addresses:
        print(f"  {address}")
    if not certfile and host not in ("127.0.0.1", "localhost", "::1"):
        print(
            "A phone opens plain-HTTP pages from another machine without the camera and the offline\n"
            "cache (browsers allow them only over HTTPS or on localhost): pass --certfile/--keyfile,\n"
            "or on Android over USB run `adb reverse tcp:PORT tcp:PORT` and open http://localhost:PORT/."
        )
    print("Press Ctrl+C to stop.")
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        print()
    finally:
        httpd.server_close()
    return 0
