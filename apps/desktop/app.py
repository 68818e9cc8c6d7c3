"""Starts the desktop classifier, or renders one result to a PNG (`--screenshot`)."""

import os
import sys


def _application():
    from PySide6.QtWidgets import QApplication

    return QApplication.instance() or QApplication(["keras-vit"])


def run(model=None, image=None, screenshot=None, settings=None):
    """`keras-vit app desktop`: opens the window (and `model`, else the last model used).

    With `screenshot`, loads `model`, classifies `image`, saves the window as a
    PNG and returns without showing anything on screen.

    Returns:
        The exit status: 0, or 1 when the screenshot shows an error.

    Raises:
        ValueError: `--screenshot` without `--model` and `--image`.
    """
    if screenshot and not (model and image):
        raise ValueError("--screenshot needs --model and --image.")
    try:
        import PySide6  # noqa: F401
    except ImportError:
        raise ValueError(
            "The desktop app needs Qt: pip install 'keras-vit[apps]' (or bash scripts/setup.sh apps)."
        ) from None
    if screenshot:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # no display needed
    elif _no_display():
        # Qt would abort the process ("could not connect to display") with no way to catch it.
        raise ValueError(
            "No display to open the window on (DISPLAY and WAYLAND_DISPLAY are unset): run it on a "
            "desktop, over ssh -X, or use --screenshot OUT.png to render a result without a screen."
        )
    application = _application()
    from keras_vit.apps.desktop.window import MainWindow

    window = MainWindow(settings=settings)
    if screenshot:
        return _screenshot(application, window, model, image, screenshot)
    window.show()
    model = model or window.last_model()
    if model:
        window.load_model(model)
    if image:
        window.classify_path(image)
    return application.exec()


def _no_display():
    return (
        sys.platform.startswith("linux")
        and not os.environ.get("QT_QPA_PLATFORM")
        and not os.environ.get("DISPLAY")
        and not os.environ.get("WAYLAND_DISPLAY")
    )


def _screenshot(application, window, model, image, path):
    from keras_vit.files import atomic_write

    window.show()
    window.load_model(model)
    window.wait()
    application.processEvents()  # delivers the loaded model to the window
    if window.model is not None:
        window.classify_path(image)
        window.wait()
    application.processEvents()
    application.processEvents()
    atomic_write(os.fspath(path), lambda temporary: window.grab().save(temporary, "PNG"))
    error = window.error_text()
    window.close()
    if error:
        raise ValueError(error)
    return 0
