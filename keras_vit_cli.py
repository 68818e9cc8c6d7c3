"""The `keras-vit` command's entry point.

It lives outside the `keras_vit` package so that `keras-vit --help` answers
before TensorFlow loads: `keras_vit/__init__.py` skips its eager imports
when this module started the process, and each command imports what it uses.
"""


def main(argv=None):
    from keras_vit.cli import main as run_command_line

    return run_command_line(argv)
