"""Keeping TensorFlow's, XLA's and CUDA's native log lines off a command's output.

TensorFlow writes its start-up lines (oneDNN, CUDA stubs, CPU features) from C++
straight to file descriptor 2 before its logging is set up, so no log level
reaches them (tensorflow/tensorflow#102212): they are muted by pointing that
descriptor at /dev/null while TensorFlow and Keras import. After that,
`TF_CPP_MIN_LOG_LEVEL=3` silences the rest (XLA's service lines, "failed call to
cuInit" on a machine without a GPU), and the Python loggers are set to errors.
LiteRT's one line ("Created TensorFlow Lite XNNPACK delegate") has no level at
all: `native_lines_muted()` mutes it where an interpreter starts.
"""

import contextlib
import logging
import os
import sys

# Python loggers that report framework internals at INFO and WARNING.
# huggingface_hub's: a download's retries ("Trying to resume download..."); its progress bar stays.
FRAMEWORK_LOGGERS = ("tensorflow", "absl", "jax._src.xla_bridge", "tf2onnx", "huggingface_hub")

_quiet = False  # set by quiet(): the command line, unless --verbose


def quiet(load_frameworks=True):
    """Silences the frameworks' logs; `load_frameworks`: import TensorFlow and Keras now, muted.

    Without it, a framework imported later still prints its start-up lines.
    """
    global _quiet
    _quiet = True
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name in FRAMEWORK_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if load_frameworks:
        with _descriptor_muted(sys.stderr):
            with contextlib.suppress(ImportError):  # a JAX-only install has no TensorFlow
                import tensorflow  # noqa: F401
            import keras  # noqa: F401


def native_lines_muted():
    """Mutes native stderr lines for a moment after `quiet()`; otherwise changes nothing.

    Library users keep every line: muting a descriptor also mutes their other threads.
    """
    return _descriptor_muted(sys.stderr) if _quiet else contextlib.nullcontext()


@contextlib.contextmanager
def _descriptor_muted(stream):
    """Sends native writes to `stream`'s descriptor to /dev/null; Python's `stream` keeps working."""
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):  # pytest's capture, a StringIO: nothing native to mute
        yield
        return
    stream.flush()
    saved = os.dup(descriptor)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
        yield
    finally:
        os.dup2(saved, descriptor)
        os.close(saved)
        os.close(devnull)
