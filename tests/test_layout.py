"""The house rules of `keras_vit/`: a few modules at the top, rooms by pipeline stage, and no
import that runs back up a floor (a room uses only the rooms below it)."""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "keras_vit")

# Bottom to top. `files` and `framework_logs` are the ground every room stands on; `export/` and
# `apps/` (installed as keras_vit.export and keras_vit.apps) use the library; the command and the
# package's public `__init__` are the roof.
FLOORS = [
    {"keras_vit.files", "keras_vit.framework_logs"},
    {"keras_vit.model"},
    {"keras_vit.data"},
    {"keras_vit.storage"},
    {"keras_vit.inference"},
    {"keras_vit.training"},
    {"keras_vit.export"},
    {"keras_vit.apps"},
    # The public modules `keras_vit.layers`, `.features`, `.optimizers` and `.pipeline` are the
    # package's API, beside its `__init__`.
    {"keras_vit.cli", "keras_vit.__main__", "keras_vit", "keras_vit.layers", "keras_vit.features"}
    | {"keras_vit.optimizers", "keras_vit.pipeline"},
]
SOURCES = {"keras_vit": PACKAGE, "keras_vit.export": os.path.join(ROOT, "export")}
SOURCES["keras_vit.apps"] = os.path.join(ROOT, "apps")


def _floor(module):
    """The floor of a dotted module name: its room's, else its own (a top-level module)."""
    for name in (".".join(module.split(".")[:2]), module):
        for floor, names in enumerate(FLOORS):
            if name in names:
                return floor
    raise AssertionError(f"{module} is on no floor: add it to tests/test_layout.py's FLOORS")


def _modules():
    """(dotted name, path) of every module of the library, the export code and the apps."""
    for package, folder in SOURCES.items():
        for directory, _, files in os.walk(folder):
            for file in sorted(files):
                if file.endswith(".py"):
                    relative = os.path.relpath(os.path.join(directory, file), folder)[: -len(".py")]
                    parts = [part for part in relative.split(os.sep) if part != "__init__"]
                    yield ".".join([package, *parts]), os.path.join(directory, file)


def _imports(path):
    """Every `keras_vit...` module `path` imports, at the top or inside a function."""
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("keras_vit"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras_vit"):
            if node.module == "keras_vit":
                yield from (f"keras_vit.{alias.name}" for alias in node.names)
            else:
                yield node.module


@pytest.mark.parametrize("module, path", list(_modules()), ids=lambda value: value if "." in value else "")
def test_no_import_runs_back_up_a_floor(module, path):
    imported = [name for name in _imports(path) if name != "keras_vit.__version__"]  # a constant
    upward = [name for name in imported if _floor(name) > _floor(module)]
    assert upward == [], f"{module} (floor {_floor(module)}) imports from above: {upward}"


def test_at_most_twelve_modules_stand_directly_in_keras_vit():
    modules = [name for name in os.listdir(PACKAGE) if name.endswith(".py")]
    assert len(modules) <= 12, sorted(modules)
    rooms = {
        name for name in os.listdir(PACKAGE) if os.path.exists(os.path.join(PACKAGE, name, "__init__.py"))
    }
    assert rooms == {"model", "data", "storage", "inference", "training"}


def test_the_tests_follow_the_rooms():
    """tests/<room>/ for keras_vit's rooms, export/ and apps/; the product-wide checks at the top."""
    tests = os.path.join(ROOT, "tests")
    folders = {name for name in os.listdir(tests) if os.path.isdir(os.path.join(tests, name))}
    assert folders - {"fixtures", "__pycache__"} <= {
        "model",
        "data",
        "storage",
        "inference",
        "training",
        "export",
        "apps",
    }
    for folder in folders - {"fixtures", "__pycache__"}:
        assert all(
            name.startswith("test_")
            for name in os.listdir(os.path.join(tests, folder))
            if name.endswith(".py")
        )


def _model_room_imports():
    """`{module: set of keras_vit.model modules it imports}` for every module of the model room."""
    modules = {name: path for name, path in _modules() if name.startswith("keras_vit.model")}
    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras_vit.model"):
                # `from keras_vit.model import registry` imports a module; `from x import NAME` x.
                for alias in node.names:
                    candidate = f"{node.module}.{alias.name}"
                    imported.add(candidate if candidate in modules else node.module)
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if a.name.startswith("keras_vit.model")}
        # A package's own parts, loaded when first asked for (its `__getattr__`, a method): a part
        # always comes with its package, so that edge closes no circle.
        graph[name] = {m for m in imported & set(modules) if not m.startswith(name + ".")}
    return graph


def test_the_model_room_has_no_import_circle():
    """The registry above the families, the checkpoint reader below them: no module of the model
    room imports, at the top or inside a function, one that comes back to it."""
    graph = _model_room_imports()
    done, path = set(), []

    def visit(module):
        if module in path:
            raise AssertionError(f"import circle: {' -> '.join(path[path.index(module) :] + [module])}")
        if module in done:
            return
        path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_no_module_outside_the_model_room_names_a_family_and_no_family_another_s_privates():
    families = ("vit", "swin", "eva")
    for module, path in _modules():
        imported = set(_imports(path))
        if not module.startswith("keras_vit.model."):
            named = [m for m in imported if any(m.startswith(f"keras_vit.model.{f}") for f in families)]
            # The public faces: each family's model class and layers (`keras_vit.layers`).
            allowed = {f"keras_vit.model.{f}.{part}" for f in families for part in ("model", "layers")}
            assert set(named) <= allowed, f"{module} names a family's insides: {sorted(set(named) - allowed)}"
            continue
        own = next((f for f in families if module.startswith(f"keras_vit.model.{f}")), None)
        if own is None:
            continue
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras_vit.model."):
                other = next((f for f in families if node.module.startswith(f"keras_vit.model.{f}")), own)
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert other == own or not private, f"{module} imports {other}'s private {private}"
