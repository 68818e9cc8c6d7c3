"""Writing run files atomically: a reader never sees a half-written model, JSON or plot."""

import json
import os
import tempfile


def atomic_write(path, write):
    """Calls `write(temporary_path)`, then renames it to `path`: never a half-written file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    suffix = os.path.splitext(path)[1]
    handle, temporary = tempfile.mkstemp(prefix=".partial-", suffix=suffix, dir=folder)
    os.close(handle)
    try:
        write(temporary)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes files private; give the usual mode
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def write_json(path, value):
    def write(temporary):
        with open(temporary, "w") as f:
            json.dump(value, f, indent=2)
            f.write("\n")

    atomic_write(path, write)


def pyplot():
    """matplotlib's pyplot on the Agg backend: plots are files, no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path):
    """Saves a matplotlib figure as PNG, atomically, and closes it."""
    atomic_write(path, lambda temporary: figure.savefig(temporary, dpi=100, format="png"))
    pyplot().close(figure)


def write_bytes(path, data):
    """Writes `data` to `path` atomically."""

    def write(temporary):
        with open(temporary, "wb") as f:
            f.write(data)

    atomic_write(os.fspath(path), write)
