"""Builds keras_vit/data/embedded/cifar10_mini.zip, the embedded default dataset.

A stratified, deterministic subset of real CIFAR-10: for each class and split,
a seeded sample of the member names (sorted first, so the sample does not
depend on the order inside the source archive). The PNG files are copied
byte for byte; the archive is stored uncompressed with fixed timestamps, so
the same source and arguments give the same bytes.

    python scripts/make_cifar10_mini.py --source ../shared/datasets/cifar10_png.zip
"""

import argparse
import collections
import hashlib
import os
import random
import sys
import tempfile
import zipfile

SOURCE_MD5 = "71d6e24755ec6e24b86ced3c6ae1436c"
DEFAULT_SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "datasets", "cifar10_png.zip")
DEFAULT_OUTPUT = os.path.join(
    os.path.dirname(__file__), "..", "keras_vit", "data", "embedded", "cifar10_mini.zip"
)
FIXED_TIME = (2020, 1, 1, 0, 0, 0)


def _md5(path):
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build(source, output, train_per_class, test_per_class, seed):
    by_split_class = collections.defaultdict(list)
    with zipfile.ZipFile(source) as archive:
        for name in archive.namelist():
            parts = name.split("/")  # cifar10/{train,test}/<class>/<file>.png
            if len(parts) == 4 and parts[3].endswith(".png"):
                by_split_class[parts[1], parts[2]].append(name)
        counts = {"train": train_per_class, "test": test_per_class}
        selected = []
        for (split, class_name), names in sorted(by_split_class.items()):
            rng = random.Random(f"{seed}/{split}/{class_name}")
            selected += sorted(rng.sample(sorted(names), counts[split]))
        folder = os.path.dirname(os.path.abspath(output))
        os.makedirs(folder, exist_ok=True)
        handle, partial = tempfile.mkstemp(suffix=".zip.partial", dir=folder)
        os.close(handle)
        try:
            with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED) as mini:
                for name in selected:
                    _, split, class_name, filename = name.split("/")
                    info = zipfile.ZipInfo(f"cifar10_mini/{split}/{class_name}/{filename}", FIXED_TIME)
                    mini.writestr(info, archive.read(name))
            os.replace(partial, output)  # never a half-written archive at the final path
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    return selected


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=DEFAULT_SOURCE, help="cifar10_png.zip (see shared/datasets)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    parser.add_argument("--train-per-class", type=int, default=300)
    parser.add_argument("--test-per-class", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not os.path.isfile(args.source):
        sys.exit(f"make_cifar10_mini: source not found: {args.source}")
    if _md5(args.source) != SOURCE_MD5:
        sys.exit(f"make_cifar10_mini: {args.source} is not the expected CIFAR-10 archive (md5 differs)")
    selected = build(args.source, args.output, args.train_per_class, args.test_per_class, args.seed)
    size = os.path.getsize(args.output)
    print(f"{args.output}: {len(selected)} images, {size:,} bytes, md5 {_md5(args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
