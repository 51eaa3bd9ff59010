"""The house's imports run one way (DESIGN §1): no import cycle between rlkit's modules — lazy
imports inside functions included, ``if TYPE_CHECKING:`` blocks excluded, ``from package import
module`` counted as importing that module — and no arrow back up the layers (types/errors/futures
<- losses <- engine <- backends; losses, engine <- rl, loops <- cli). The command line is the top: only
``rlkit.__main__`` imports ``rlkit.cli`` (a command's module imports what the CLI imports, e.g.
``rlkit.composition``, never the CLI). vLLM sampling is built on the local engine, so the local
engine never imports it (the backend registry chooses between them)."""

import ast
from pathlib import Path
import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

ROOT = Path(__file__).resolve().parents[2] / "rlkit"

#: package prefix -> prefixes it must never import
FORBIDDEN = {
    "rlkit.types": ("rlkit.",),
    "rlkit.errors": ("rlkit.",),
    "rlkit.losses": ("rlkit.engine", "rlkit.backends", "rlkit.rl", "rlkit.loops", "rlkit.cli", "rlkit.runs", "rlkit.tasks"),
    # the engine contract: the front door builds and validates losses (engine -> losses, never back)
    "rlkit.engine": ("rlkit.backends", "rlkit.rl", "rlkit.loops", "rlkit.cli", "rlkit.runs", "rlkit.scaffold", "rlkit.tasks",
                     "rlkit.config", "rlkit.composition", "rlkit.session", "rlkit.front_door"),
    "rlkit.backends": ("rlkit.rl", "rlkit.loops", "rlkit.cli", "rlkit.runs", "rlkit.scaffold", "rlkit.tasks",
                       "rlkit.config", "rlkit.composition"),
    "rlkit.backends.local": ("rlkit.backends.vllm",),
    "rlkit.tasks": ("rlkit.rl", "rlkit.loops", "rlkit.cli", "rlkit.runs", "rlkit.scaffold"),
    "rlkit.config": ("rlkit.loops", "rlkit.rl", "rlkit.cli"),
    "rlkit.rewards": ("rlkit.rl", "rlkit.loops", "rlkit.tasks", "rlkit.cli"),
    "rlkit.sandbox": ("rlkit.rl", "rlkit.loops", "rlkit.tasks", "rlkit.cli", "rlkit.rewards"),
}
ALLOWED_TYPES_IMPORTS = ("rlkit.errors",)  # types.py may use the error classes


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_module(name: str) -> bool:
    """Whether ``rlkit.a.b`` is a module or package of rlkit (not a name defined in one)."""
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path, name: str, type_checking: bool = False) -> set:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` bodies are not imports at run time
        if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("rlkit"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("rlkit"):
                # `from package import module` imports that module, not only the package; a package
                # whose names are all its modules (`from rlkit import constraints`) is not itself an edge
                found.update(f"{target}.{a.name}" for a in node.names)
                if not all(is_module(f"{target}.{a.name}") for a in node.names):
                    found.add(target)
    return found


def graph(type_checking: bool = False):
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        targets = set()
        for imp in imports_of(path, name, type_checking):
            while imp and imp not in modules:  # `from rlkit.x import y` where y is a name
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                targets.add(imp)
        edges[name] = targets
    return edges


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def is_package_init_edge(a: str, b: str) -> bool:
    """A package's ``__init__`` re-exporting its own submodules is not an arrow back up."""
    return b.startswith(a + ".") or a.startswith(b + ".")


def folder(module: str) -> str:
    """The unit a loop between folders is counted in: ``rlkit.rl.loop`` -> ``rlkit.rl``; a top-level
    module (``rlkit.cost``) is its own unit, the package's ``__init__`` is ``rlkit``."""
    return ".".join(module.split(".")[:2])


def test_no_loop_between_folders():
    """Issue 52 item 4: no circle through folders either, lazy imports included (rl/ -> cost.py ->
    composition.py -> rl/ was one: each module-level graph was acyclic, the folders were not)."""
    edges = {}
    for a, bs in graph().items():
        edges.setdefault(folder(a), set()).update(folder(b) for b in bs if folder(b) != folder(a))
    assert cycles(edges) == []


def test_no_import_cycles():
    edges = graph()
    pruned = {a: {b for b in bs if not is_package_init_edge(a, b)} for a, bs in edges.items()}
    assert cycles(pruned) == []


def test_no_cycles_even_through_type_checking_imports():
    """A type-only import back up (a client naming its service's class) is a cycle in the design:
    declare a protocol below both instead (e.g. rlkit.backends.sagemaker.service)."""
    edges = graph(type_checking=True)
    pruned = {a: {b for b in bs if not is_package_init_edge(a, b)} for a, bs in edges.items()}
    assert cycles(pruned) == []


def test_from_package_import_module_is_an_edge_to_that_module():
    """The resolution the cycle tests rely on: ``from rlkit.backends.tinker.server import checks``
    (in state.py) is an import of ``...server.checks``, not only of the package."""
    assert "rlkit.backends.tinker.server.checks" in graph()["rlkit.backends.tinker.server.state"]


def test_only_the_entry_point_imports_the_cli():
    importers = sorted(name for name, targets in graph().items() if "rlkit.cli" in targets)
    assert importers == ["rlkit.__main__"]


def test_no_arrow_runs_back_up_the_layers():
    bad = []
    for name, targets in graph().items():
        for prefix, banned in FORBIDDEN.items():
            if name == prefix or name.startswith(prefix + "."):
                for t in targets:
                    if name == "rlkit.types" and t in ALLOWED_TYPES_IMPORTS:
                        continue
                    if t.startswith(banned) and not t.startswith(prefix):
                        bad.append(f"{name} -> {t}")
    assert bad == []
