"""The README from its Export section on, as tests/test_readme.py runs the rest: a file of its
own, so that another worker runs it at the same time."""

from test_readme import run_session


def test_every_readme_block_from_the_export_section_on_runs_or_says_why_not(tmp_path):
    run_session(tmp_path, "export")
