"""A training run that dies right after its backup at a chosen step is written, as a kill would
stop it there (no cleanup, no epoch end), for the exact-resume tests:

    python tests/kill_after_backup.py STEP -- train ...

It exits with `KILLED`, so a test can tell this death from a failure.
"""

import os
import sys

KILLED = 86


def kill_after_backup(step):
    from keras_vit.training.callbacks import ResumableBackup, optimizer_step

    save = ResumableBackup._save_model

    def saved_then_killed(backup):
        save(backup)
        if optimizer_step(backup.model) == step:
            os._exit(KILLED)

    ResumableBackup._save_model = saved_then_killed


if __name__ == "__main__":
    step, separator, *command = sys.argv[1:]
    assert separator == "--", sys.argv
    import keras_vit_cli  # first: keras_vit's import then leaves TensorFlow to the command
    from keras_vit import framework_logs

    framework_logs.quiet()
    kill_after_backup(int(step))
    sys.exit(keras_vit_cli.main(command))
