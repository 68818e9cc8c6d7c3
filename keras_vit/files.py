"""Writing run files atomically: a reader never sees a half-written model, JSON or plot,
and a full disk is one clear error (`DiskFullError`) that names the file and the space."""

import errno
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


def size_of(path):
    """A file's size in bytes; 0 when there is none."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def folder_size(path):
    """The bytes of every file under `path`; 0 when there is none."""
    return sum(size_of(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


def atomic_write(path, write):
    """Calls `write(temporary_path)`, then renames it to `path`: never a half-written file.

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
            raise DiskFullError(path, max(size_of(path), size_of(temporary))) from None
        raise
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
