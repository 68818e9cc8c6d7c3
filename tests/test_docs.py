"""The documentation site and the README that points into it: `mkdocs build --strict` passes (a
broken link or anchor, a page left out of the nav, an API name mkdocstrings cannot find fails),
every hand-written page is in the nav (so tests/test_readme.py runs its blocks), and the README
stays a page long, its families table counting what keras-vit has."""

import os
import re
import subprocess
import sys

from conftest import HANG_SECONDS
from test_readme import GENERATED, MKDOCS, ROOT, pages

import keras_vit

README_LINES = 250  # issue 46: a README that fits on a page; a guide goes into docs/


def test_mkdocs_builds_the_site_strictly_with_no_warning(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", MKDOCS]
        + ["--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "WARNING" not in output, output[-6000:]
    assert (tmp_path / "site" / "api" / "index.html").exists(), output[-3000:]


def test_every_hand_written_page_is_in_the_nav():
    """A page outside the nav would keep its code blocks from tests/test_readme.py."""
    docs = os.path.join(ROOT, "docs")
    written = {f"docs/{name}" for name in os.listdir(docs) if name.endswith(".md")}
    assert written - set(pages()) == set()
    assert all(not page.startswith(f"docs/{GENERATED}") for page in pages())


def test_the_readme_fits_on_a_page():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines; a guide goes into docs/"


def test_the_readme_counts_each_familys_configs_and_pretrained_names():
    from keras_vit.model.registry import FAMILIES, family_named

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    rows = re.findall(r"^\| [^|]*\(`keras_vit\.(\w+)`\) \|[^|]*\| ([\d,]+) \| ([\d,]+) \|$", readme, re.M)
    counted = {}
    for model_class, configs, pretrained in rows:
        family = getattr(keras_vit, model_class).family
        counted[family] = (int(configs.replace(",", "")), int(pretrained.replace(",", "")))
    actual = {
        family: (
            sum(family_named(name).name == family for name in keras_vit.list_models()),
            sum(family_named(name).name == family for name in keras_vit.list_pretrained()),
        )
        for family in FAMILIES
    }
    assert counted == actual, "README.md's families table: (configs, pretrained names) per family"


def test_the_readmes_links_and_pictures_exist():
    """mkdocs checks the pages' links; the README, outside the site, is checked here."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme) + re.findall(r'src="([^"]+)"', readme)
    local = [target for target in targets if not re.match(r"\w+://", target)]
    assert len(local) > 10, local  # the README links into the docs
    for target in local:
        path, _, anchor = target.partition("#")
        assert os.path.exists(os.path.join(ROOT, path)), target
        if anchor:
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                headings = re.findall(r"^#+ (.+)$", f.read(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, (target, sorted(slugs))
