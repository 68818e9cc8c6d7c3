"""Drives the app in headless Chromium as a phone (Playwright): for the tests and the screenshot.

Uses the system's Chromium (Debian: `apt-get install chromium`), never a downloaded browser.
"""

import contextlib
import os
import shutil

PHONE = "Pixel 7"  # Playwright's device: a 412 x 839 viewport, touch, a mobile user agent
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# What a root, offline, headless Chromium needs; the fake camera feeds the live mode in tests.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
)
# WebGPU where there is no GPU (headless, CI): Chromium's software adapter (SwiftShader), which
# --disable-gpu would turn off.
WEBGPU_ARGS = tuple(arg for arg in CHROMIUM_ARGS if arg != "--disable-gpu") + ("--enable-unsafe-webgpu",)
LOAD_TIMEOUT_MS = 60_000


def find_chromium():
    """The Chromium to drive: $KERAS_VIT_CHROMIUM, else the first on PATH; None when there is none."""
    explicit = os.environ.get("KERAS_VIT_CHROMIUM")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    return next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


class Phone:
    """Headless Chromium that opens phone-sized browser contexts (each with its own storage)."""

    def __init__(self, playwright, browser):
        self.playwright = playwright
        self.browser = browser

    def new_context(self, **options):
        return self.browser.new_context(**self.playwright.devices[PHONE], permissions=["camera"], **options)

    @contextlib.contextmanager
    def with_webgpu(self):
        """A second `Phone` on the same Playwright whose Chromium has WebGPU (a software adapter
        where the machine has no GPU)."""
        browser = self.playwright.chromium.launch(executable_path=find_chromium(), args=list(WEBGPU_ARGS))
        try:
            yield Phone(self.playwright, browser)
        finally:
            browser.close()


@contextlib.contextmanager
def phone_browser():
    """Yields a `Phone`: the system's Chromium under Playwright, closed on exit."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise ValueError("Driving the app needs Playwright: pip install playwright.") from None
    chromium = find_chromium()
    if chromium is None:
        raise ValueError(
            "Chromium not found: install it (Debian: apt-get install chromium) or set KERAS_VIT_CHROMIUM."
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS))
        try:
            yield Phone(playwright, browser)
        finally:
            browser.close()


def open_app(context, url):
    """Opens the app and waits until its model has loaded (or failed to); returns the page."""
    page = context.new_page()
    page.goto(url)
    page.wait_for_function("document.body.dataset.state", timeout=LOAD_TIMEOUT_MS)
    return page


def wait_until_offline_ready(page):
    """Waits until the service worker controls the page and has cached every file."""
    page.wait_for_function("navigator.serviceWorker.controller !== null", timeout=LOAD_TIMEOUT_MS)
    page.evaluate("navigator.serviceWorker.ready")


def classify(page, image_path):
    """Gives the page one image, as picking it from the gallery does, and returns its result.

    Returns `{"predictions": [{"name", "probability"}...], "error": message or None}`.
    """
    before = page.evaluate("window.kerasVit.results")
    errors_before = page.evaluate("document.getElementById('error').textContent")
    page.set_input_files("#gallery-input", str(image_path))
    page.wait_for_function(
        "([before, errorBefore]) => window.kerasVit.results > before"
        " || (!document.getElementById('error').hidden"
        " && document.getElementById('error').textContent !== errorBefore)",
        arg=[before, errors_before],
        timeout=LOAD_TIMEOUT_MS,
    )
    return read_result(page)


def read_result(page):
    """The predictions on the page (rank order) and the error shown, if any."""
    predictions = page.eval_on_selector_all(
        "[data-testid=prediction]",
        "items => items.map(item => ({name: item.dataset.className,"
        " probability: Number(item.dataset.probability), text: item.innerText}))",
    )
    error = page.evaluate("(e => e.hidden ? null : e.textContent)(document.getElementById('error'))")
    return {"predictions": predictions, "error": error}


def screenshot(url, image_path, output):
    """Opens the app as a phone, classifies `image_path` and saves the screen as a PNG."""
    with phone_browser() as phone:
        page = open_app(phone.new_context(), url)
        result = classify(page, image_path)
        if result["error"]:
            raise ValueError(result["error"])
        page.screenshot(path=str(output))
    return result
