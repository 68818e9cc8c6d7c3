"""A disk that fills up at a chosen moment, for the disk-full tests.

`fill(disk, leave)` fills a small tmpfs until `leave` bytes are free. Run as a script, it runs a
keras-vit command and fills the disk right before a chosen writer runs for the N-th time, so a
test can stop training during a backup, the end-of-epoch save or TensorBoard's writes instead
of whenever a timer happens to fire:

    python tests/full_disk.py DISK TARGET CALL LEAVE -- train ...

TARGET is `module.attribute` or `module.Class.method`, e.g.
`keras_vit.training.callbacks.ResumableBackup._save_model`.
"""

import errno
import importlib
import os
import sys
from pathlib import Path

FILLER = "filler"


def fill(disk, leave=0):
    """Writes a file in `disk` until it is full, then gives back `leave` bytes of it, so the next
    write of more than that fails part way; returns the file (delete it to free the space)."""
    filler = os.path.join(disk, FILLER)
    with open(filler, "ab", buffering=0) as f:
        for block in (1 << 20, 1 << 12):  # fast, then to the last page
            try:
                while True:
                    f.write(b"\0" * block)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
    os.truncate(filler, max(0, os.path.getsize(filler) - leave))
    return Path(filler)


def fill_before(target, call, disk, leave):
    """Makes the `call`-th call of `target` fill `disk` (leaving `leave` bytes) first."""
    module_name, attribute = target.rsplit(".", 1)
    owner_name = None
    if module_name.rsplit(".", 1)[-1][:1].isupper():
        module_name, owner_name = module_name.rsplit(".", 1)
    owner = importlib.import_module(module_name)
    if owner_name:
        owner = getattr(owner, owner_name)
    original = getattr(owner, attribute)
    calls = []

    def filled_first(*args, **kwargs):
        calls.append(None)
        if len(calls) == call:
            fill(disk, leave)
        return original(*args, **kwargs)

    setattr(owner, attribute, filled_first)


if __name__ == "__main__":
    disk, target, call, leave, separator, *command = sys.argv[1:]
    assert separator == "--", sys.argv
    import keras_vit_cli  # first: keras_vit's import then leaves TensorFlow to the command
    from keras_vit import framework_logs

    framework_logs.quiet()  # as the command does, before the target's import loads TensorFlow
    fill_before(target, int(call), disk, int(leave))
    sys.exit(keras_vit_cli.main(command))
