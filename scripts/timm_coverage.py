"""How many of timm's pretrained ViT tags keras-vit resolves by name, and why each other one not.

    .venv/bin/python scripts/timm_coverage.py            # the counts, then each unresolved tag
    .venv/bin/python scripts/timm_coverage.py --json     # the same as JSON

For the installed timm: every pretrained tag of its `vision_transformer`, `deit`,
`vision_transformer_hybrid`, `vision_transformer_relpos` and `eva` modules, resolved when
`keras_vit.create_model(tag, pretrained=True)` finds it in keras-vit's generated table
(`scripts/generate_pretrained_table.py`), else with the reason it is not.
"""

import argparse
import collections
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import timm  # noqa: E402

from keras_vit.model.eva.configs import TIMM_UNBUILT as EVA_UNBUILT  # noqa: E402
from keras_vit.model.pretrained import pretrained_table  # noqa: E402
from keras_vit.model.vit.configs import TIMM_UNBUILT  # noqa: E402

MODULES = ("vision_transformer", "deit", "vision_transformer_hybrid", "vision_transformer_relpos", "eva")
# Why an entry point of each family keras-vit builds is not built (its configs' TIMM_UNBUILT).
UNBUILT = {**TIMM_UNBUILT, **EVA_UNBUILT}


def coverage():
    """`{"timm_version", "table_timm_version", "tags", "resolved", "unresolved": {tag: reason},
    "modules": {module: {"tags", "resolved"}}}`."""
    table = pretrained_table()
    tags, unresolved, modules = [], {}, {}
    for module in MODULES:
        before = (len(tags), len(unresolved))
        for architecture in timm.list_models(module=module):
            for tag in timm.list_pretrained(f"{architecture}.*"):
                tags.append(tag)
                reason = _unresolved(tag, architecture, table)
                if reason:
                    unresolved[tag] = reason
        count = len(tags) - before[0]
        modules[module] = {"tags": count, "resolved": count - (len(unresolved) - before[1])}
    return {
        "modules": modules,
        "timm_version": timm.__version__,
        "table_timm_version": table["timm_version"],
        "tags": len(tags),
        "resolved": len(tags) - len(unresolved),
        "unresolved": unresolved,
    }


def _unresolved(tag, architecture, table):
    """Why keras-vit does not resolve `tag`, or None when it does."""
    if tag in table["tags"]:
        return None
    if architecture in UNBUILT:
        return UNBUILT[architecture]
    return f"not in keras-vit's table, generated from timm {table['timm_version']}: run the generator again"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = coverage()
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
        return 0
    print(
        f"timm {result['timm_version']} (table from timm {result['table_timm_version']}): keras-vit "
        f"resolves {result['resolved']} of {result['tags']} pretrained ViT tags of {', '.join(MODULES)}."
    )
    for module, counts in result["modules"].items():
        print(f"  {module}: {counts['resolved']} of {counts['tags']}")
    reasons = collections.Counter(result["unresolved"].values())
    for reason, count in reasons.most_common():
        print(f"  {count:4d} unresolved: {reason}")
    for tag, reason in sorted(result["unresolved"].items()):
        print(f"{tag}\t{reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
