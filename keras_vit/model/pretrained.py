"""Pretrained ViTs by name, with timm's names and conventions, from a model hub.

    model = keras_vit.create_model("vit_small_patch16_224.augreg_in21k_ft_in1k", pretrained=True)

A name is one of:
- `arch`: timm's default tag for an architecture keras-vit builds (`vit_base_patch16_224`);
- `arch.tag`: one of timm's tags for it (`deit3_small_patch16_224.fb_in22k_ft_in1k`);
- `hf-hub:org/repo[@revision]`: any timm repo of a family's, or a transformers one of the types
  the families read (ViT, DeiT, DINOv2, SigLIP, CLIP, Swin, DINOv3) on the hub;
- `local-dir:/path`: a folder in the same layout (`save_pretrained` writes one).

The known tags, with their repo, input size and label set, are a table
generated from timm (`scripts/generate_pretrained_table.py`). Whatever the name, the repo's own
`config.json` decides the image size, normalisation, class names and `model_args`, and, for
`hf-hub:` and `local-dir:` names, the architecture; an `arch` or `arch.tag` name builds `arch`, as
timm does (several tags share a repo: `vit_base_patch32_clip_quickgelu_224.metaclip_2pt5b` reads the
weights of `vit_base_patch32_clip_224.metaclip_2pt5b`, whose config names that one). A classifier
without class names gets those of the label set its class count implies.
"""

import difflib
import functools
import gzip
import json
import logging
import os
import re

from keras_vit.files import read_json
from keras_vit.model import hub, hub_config

TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tables")
# Pretrained tags shipped inside the package, a folder each in the hub's layout: the offline
# default for their own names (embedded/README.md: the ViT-Ti, its provenance and licence).
EMBEDDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "embedded")
TABLE_FILE = "pretrained.json"
# A label set's classes, a row each: the WordNet id, a tab, timm's description.
LABEL_SET_FILE = "{}.tsv.gz"
HUB_PREFIX, LOCAL_PREFIX = "hf-hub:", "local-dir:"
_REPO = re.compile(r"[\w.-]+/[\w.-]+")
logger = logging.getLogger(__name__)
_announced = set()  # embedded copies this process has said it uses


def pretrained_table():
    """The generated table: `{"defaults": {arch: "arch.tag"}, "tags": {"arch.tag": {...}}, ...}`."""
    return _table()


@functools.cache
def _table():
    with open(os.path.join(TABLES, TABLE_FILE)) as f:
        return json.load(f)


def list_pretrained(filter=None):
    """The pretrained names keras-vit knows (`arch.tag`, timm's), sorted; `filter`: a substring."""
    return sorted(name for name in _table()["tags"] if filter is None or filter in name)


def is_pretrained_name(text):
    """Whether `text` is written as a pretrained name (it may still name nothing that exists)."""
    text = str(text)
    table = _table()
    return text.startswith((HUB_PREFIX, LOCAL_PREFIX)) or text in table["tags"] or text in table["defaults"]


def looks_like_a_name(text):
    """A word with no folder, and no file extension or an architecture's name before its first
    dot: meant as a pretrained name (`arch.tag`) rather than a path, when no file has it."""
    text = str(text)
    if os.sep in text or "/" in text:
        return False
    return not os.path.splitext(text)[1] or text.split(".")[0] in _table()["architectures"]


def label_set(name):
    """The class descriptions of an ImageNet label set (`imagenet-1k`, ...), as timm gives them."""
    return [description for _, description in _label_rows(name)]


def wordnet_ids(class_names):
    """The WordNet ids (`n01440764`, ...) of `class_names` when they are a label set keras-vit
    ships (a pretrained ImageNet classifier's), else None: the folder names of ImageNet data."""
    for name, count in _table()["label_sets"].items():
        if count == len(class_names or ()) and label_set(name) == list(class_names):
            return [wnid for wnid, _ in _label_rows(name)]
    return None


@functools.cache
def _label_rows(name):
    with gzip.open(os.path.join(TABLES, LABEL_SET_FILE.format(name)), "rt") as f:
        return [tuple(line.split("\t", 1)) for line in f.read().splitlines()]


def class_names_for(num_classes):
    """The names of the label set with `num_classes` classes that keras-vit ships, or None."""
    for name, count in _table()["label_sets"].items():
        if count == num_classes:
            return label_set(name)
    return None


class Source:
    """Where a name's files are: a hub repo (`repo`, `revision`) or a local folder (`folder`);
    `architecture`: the architecture a timm tag names, which its repo's config may not;
    `embedded`: the copy shipped inside keras-vit, used when the hub cannot be reached."""

    def __init__(
        self,
        name,
        repo=None,
        revision=None,
        folder=None,
        architecture=None,
        embedded=None,
        url=None,
        config=None,
    ):
        self.name, self.repo, self.revision, self.folder = name, repo, revision, folder
        self.architecture, self.embedded = architecture, embedded
        # Weights at a URL, on no hub (timm's `pretrained_cfg` `url`), with the config.json the
        # table gives in place of a repo's.
        self.url, self.config = url, config

    def file(self, filename):
        """The local path of one of the source's files (downloaded when from a hub)."""
        if self.folder is not None:
            path = os.path.join(self.folder, filename)
            if not os.path.isfile(path):
                raise hub.MissingFile(f"{self.folder} has no {filename}.")
            return path
        try:
            return hub.download(self.repo, filename, self.revision)
        except hub.Unreachable as error:
            self._use_embedded(error)
            return self.file(filename)

    def weights(self):
        """The path of its weights: safetensors when it has them."""
        if self.url is not None:
            return hub.download_url(self.url)
        if self.folder is None:
            try:
                return hub.download_first(self.repo, hub.WEIGHTS_FILES, self.revision)[1]
            except hub.Unreachable as error:
                self._use_embedded(error)
        for filename in hub.WEIGHTS_FILES:
            if os.path.isfile(os.path.join(self.folder, filename)):
                return os.path.join(self.folder, filename)
        raise hub.HubError(f"{self.folder} has none of {', '.join(hub.WEIGHTS_FILES)}.")

    def _use_embedded(self, error):
        """From now on, the files shipped inside keras-vit; without such a copy, `error` stands."""
        if self.embedded is None:
            # The request ends here, telling the user to run it again: that run must probe anew,
            # not repeat the "down" remembered for 30 s (in one Python session, as a notebook).
            hub.forget_unanswered()
            raise error
        self.folder = self.embedded
        if self.embedded in _announced:  # one line a process, however often the name is read
            return
        _announced.add(self.embedded)
        reason = "HF_HUB_OFFLINE is set" if hub.offline() else "the hub cannot be reached"
        logger.warning(
            "%s is not in the model cache and %s: using the copy shipped inside keras-vit (%s).",
            self.name, reason, self.embedded,
        )  # fmt: skip


def resolve(name):
    """The `Source` of a pretrained name.

    Raises:
        ValueError: a name that is none of the four forms; the message lists close names.
    """
    name = str(name)
    if name.startswith(LOCAL_PREFIX):
        folder = os.path.expanduser(name[len(LOCAL_PREFIX) :])
        if not os.path.isdir(folder):
            raise ValueError(f"{name}: no folder {folder} (local-dir: takes a folder save_pretrained wrote).")
        return Source(name, folder=folder)
    if name.startswith(HUB_PREFIX):
        repo, _, revision = name[len(HUB_PREFIX) :].partition("@")
        if not _REPO.fullmatch(repo):
            raise ValueError(f"{name}: hf-hub: takes a repo as org/name, optionally @revision.")
        return Source(name, repo=repo, revision=revision or None)
    table = _table()
    tag = table["defaults"].get(name, name)
    if tag in table["tags"] and "url" in table["tags"][tag]:
        entry = table["tags"][tag]
        return Source(name, architecture=tag.split(".")[0], url=entry["url"], config=_url_config(tag, entry))
    if tag in table["tags"]:
        embedded = os.path.join(EMBEDDED, tag)
        return Source(
            name, repo=table["tags"][tag]["repo"], architecture=tag.split(".")[0],
            embedded=embedded if os.path.isdir(embedded) else None,
        )  # fmt: skip
    raise ValueError(f"Unknown pretrained name {name!r}: {unknown_name(name)}")


def _url_config(tag, entry):
    """timm's config.json for a tag whose weights are at a URL: its architecture and the
    pretrained_cfg the table carries."""
    fields = ("mean", "std", "crop_pct", "crop_mode", "interpolation", "license")
    pretrained = {field: entry[field] for field in fields if entry.get(field) is not None}
    pretrained["input_size"] = [3, *entry["image_size"]]
    return {
        "architecture": tag.split(".")[0],
        "num_classes": entry["num_classes"],
        "pretrained_cfg": pretrained,
    }


def unknown_name(name):
    """What to say of a name that is no pretrained name: its architecture's tags, or close names."""
    table = _table()
    architecture = name.split(".")[0]
    tags = sorted(t for t in table["tags"] if t.startswith(architecture + "."))
    if tags:
        return f"{architecture}'s tags are {', '.join(tags)}."
    close = difflib.get_close_matches(name, [*table["tags"], *table["defaults"]], n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return (
        f"{hint}`keras-vit models --pretrained` lists the names; hf-hub:org/repo and "
        f"local-dir:/path name any ViT repo."
    )


def read_hub_model(source, families):
    """The repo's `HubModel` (its `config.json`, and transformers' preprocessor settings), built by
    one of `families` (the registry's: `registry.read_hub_model` passes them)."""
    config = source.config if source.config is not None else read_json(source.file(hub.CONFIG_FILE))
    preprocessor = None
    if "model_type" in config:
        try:
            preprocessor = read_json(source.file(hub.PREPROCESSOR_FILE))
        except hub.MissingFile:
            preprocessor = None
    return hub_config.read_config(
        config, source.name, families, preprocessor, architecture=source.architecture
    )


class ToBuild:
    """What a pretrained name builds: its `family`, the model's `arguments` and its `source`'s
    weights (`weights_path()` downloads them when from a hub). The registry builds it."""

    def __init__(self, family, arguments, source):
        self.family, self.arguments, self.source = family, arguments, source

    def weights_path(self):
        return self.source.weights()


def what_to_build(name, overrides, families):
    """The `ToBuild` of a pretrained name, with `overrides` (the model's arguments): another
    `num_classes` gives a new head (its class names dropped unless given), another `image_size`
    resampled position embeddings (ViT) or bias tables (Swin, with another `window_size`);
    `families`: those that may build it (the registry's)."""
    source = resolve(name)
    found = read_hub_model(source, families)
    return ToBuild(found.family, _arguments(found, overrides), source)


def _arguments(found, overrides):
    arguments = dict(
        found.arguments, image_mean=found.image_mean, image_std=found.image_std, license=found.license
    )
    if found.num_classes:
        class_names = found.class_names or class_names_for(found.num_classes)
        arguments.update(num_classes=found.num_classes, class_names=class_names)
    else:
        arguments.update(include_top=False)
    if "num_classes" in overrides and overrides["num_classes"] != arguments.get("num_classes"):
        arguments.pop("class_names", None)
        arguments["include_top"] = True
    arguments.update(overrides)
    arguments.setdefault("name", found.name)
    return arguments


def save_pretrained(model, folder, architecture=None):
    """Writes `model` (a keras-vit ViT) in timm's hub layout: `model.safetensors` and
    `config.json`, which `timm.create_model("local-dir:folder", pretrained=True)` and
    `keras_vit.create_model("local-dir:folder", pretrained=True)` both load. Upload the folder
    with `huggingface_hub.HfApi().upload_folder`.

    `architecture`: the timm architecture to publish it as, with `model_args` for whatever the
    model has otherwise (as timm's `save_for_hf` records them); by default the model's own name
    when timm has it (as `create_model` names its models), else the nearest one timm has.

    Raises:
        ValueError: an architecture timm lacks, or a model timm's ViT cannot be (named).
    """
    from keras_vit.files import write_json
    from keras_vit.model.weights import save_state_dict

    architectures = _table()["architectures"]
    architecture = architecture or hub_config.timm_architecture(model, architectures)
    if architecture not in architectures:
        raise ValueError(
            f"save_pretrained(architecture=...) takes a timm architecture to publish the model as; "
            f"{architecture!r} is not one keras-vit and timm share (`keras-vit models --pretrained`)."
        )
    config = hub_config.timm_config(model, architecture)  # refuses what timm cannot build
    os.makedirs(folder, exist_ok=True)
    save_state_dict(model, os.path.join(folder, hub.WEIGHTS_FILES[0]))
    write_json(os.path.join(folder, hub.CONFIG_FILE), config)
    return folder
