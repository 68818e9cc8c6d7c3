"""Writing run files atomically: a reader never sees a half-written model, JSON or plot,
and a full disk is one clear error (`DiskFullError`) that names the file and the space."""

import contextlib
import errno
import io
import json
import os
import pathlib
import tempfile

# A write that failed for want of space: the disk, a quota, or a file-size limit.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DiskFullError(OSError):
    """No space to write `path`; `needed` bytes is what the file takes (its last version's
    size, or what was written before the write failed, whichever is more)."""

    def __init__(self, path, needed):
        self.path, self.needed = os.fspath(path), int(needed)
        folder = os.path.dirname(os.path.abspath(self.path))
        super().__init__(
            errno.ENOSPC,
            f"No space left to write {self.path} (it needs about {human_size(self.needed)}; "
            f"{human_size(_free_bytes(folder))} free there): free some space and run the same command "
            f"again. Nothing written before was lost.",
        )

    def __str__(self):
        return self.strerror


def human_size(count):
    """`count` bytes for people: 31 bytes, 372 KB, 1.2 MB, 3.4 GB."""
    if count < 1e3:
        return f"{count} bytes"
    if count < 1e6:
        return f"{count / 1e3:.0f} KB"
    if count < 1e9:
        return f"{count / 1e6:.1f} MB"
    return f"{count / 1e9:.1f} GB"


def _free_bytes(folder):
    try:
        stats = os.statvfs(folder)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def is_disk_full(error):
    """Whether `error` (from Python, h5py or TensorFlow) means there was no space to write."""
    if isinstance(error, DiskFullError):
        return True
    if getattr(error, "errno", None) in _NO_SPACE:
        return True
    message = str(error)
    return any(os.strerror(code) in message for code in _NO_SPACE) or "errno = 28" in message


@contextlib.contextmanager
def disk_full_names(path):
    """Turns a full disk reported by a native writer (TensorFlow's, in its own error types)
    into a `DiskFullError` that names `path`."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as error:
        if not is_disk_full(error):
            raise
        raise DiskFullError(path, folder_size(path) if os.path.isdir(path) else size_of(path)) from None


def size_of(path):
    """A file's size in bytes; 0 when there is none."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def folder_size(path):
    """The bytes of every file under `path`; 0 when there is none."""
    return sum(size_of(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


def atomic_write(path, write, size=0):
    """Calls `write(temporary_path)`, then renames it to `path`: never a half-written file.

    `write` must be plain Python file writes (or a library that reports a failed write as an
    exception): a native writer that can crash on a full disk (HDF5) serialises in memory
    first, and `write_bytes` writes the bytes. `size`, when known, is what the file takes.

    Raises:
        DiskFullError: no space for the file; `path` keeps its previous version.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # Every suffix: Keras insists on `.weights.h5`, and `.keras`, for what it writes.
    suffix = "".join(pathlib.Path(path).suffixes)
    try:
        handle, temporary = tempfile.mkstemp(prefix=".partial-", suffix=suffix, dir=folder)
    except OSError as error:
        if is_disk_full(error):
            raise DiskFullError(path, size_of(path)) from None
        raise
    os.close(handle)
    try:
        write(temporary)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes files private; give the usual mode
        os.replace(temporary, path)
    except Exception as error:
        if is_disk_full(error):
            raise DiskFullError(path, max(size, size_of(path), size_of(temporary))) from None
        raise
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def read_json(path, kind=dict):
    """A JSON file keras-vit wrote, holding a `kind` (dict or list); one line naming the file when
    it is damaged (cut short, not JSON, not UTF-8, another shape)."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{path} is damaged ({error}): restore it, or write it again.") from None
    if not isinstance(value, kind):
        raise ValueError(f"{path} is damaged: it holds a {type(value).__name__}, not a {kind.__name__}.")
    return value


def write_json(path, value):
    write_text(path, json.dumps(value, indent=2) + "\n")


def write_text(path, text):
    """Writes `text` to `path` atomically, as UTF-8."""
    write_bytes(path, text.encode())


def pyplot():
    """matplotlib's pyplot on the Agg backend: plots are files, no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path):
    """Saves a matplotlib figure as PNG, atomically, and closes it."""
    image = io.BytesIO()  # the PNG encoder writes to memory; Python writes the file
    figure.savefig(image, dpi=100, format="png")
    pyplot().close(figure)
    write_bytes(path, image.getvalue())


def write_bytes(path, data):
    """Writes `data` to `path` atomically."""

    def write(temporary):
        with open(temporary, "wb") as f:
            f.write(data)

    atomic_write(os.fspath(path), write, size=len(data))
