"""The docs pages from the export page on (docs/export.md and the pages after it in mkdocs.yml's
nav), as tests/test_readme.py runs the README and the pages before it: a file of its own, so
that another worker runs it at the same time."""

from test_readme import run_session


def test_every_block_from_the_export_page_on_runs_or_says_why_not(tmp_path):
    run_session(tmp_path, "export")
