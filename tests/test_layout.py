"""The tree shows the architecture: every import of graders/ runs downward, as each package's docstring
says, with no import circle, and no module grows past 500 lines.

Read statically (ast), so the test needs no torch and sees imports inside functions too."""
import ast
import functools
from pathlib import Path

import pytest

from graders.frame.catalogue import REPO_ROOT

GRADERS = REPO_ROOT / "graders"

# The layers, from the bottom up: what each package may import of graders (besides itself).
MAY_IMPORT = {
    "frame": set(),
    "isolation": {"frame"},
    "run": {"frame", "isolation"},
    "katas": {"run"},  # the run path's vocabulary, and nothing else of the graders
    "batch": {"frame"},
    "dev": {"frame", "run"},
    "learner": {"frame", "isolation", "run", "batch"},
    "competition": {"frame", "isolation", "batch"},  # and Dask (distributed), in fleet.py and jobs.py
    # The live competition service, a layer above competition: its web application, database and grading
    # queue; the team client in it is what cli dispatches `score.py --submit` to.
    "arena": {"frame", "isolation", "batch", "competition"},
    "cli": {"frame", "isolation", "batch", "learner", "competition", "arena"},
    "": {"cli", "learner", "isolation", "dev", "arena"},  # the entry points graders/score.py, watch.py, scan.py, devcheck.py, arena.py
}
MAX_LINES = 500


ENTRY_POINT = "graders/"  # an entry point script's key: its path, so graders/arena.py is not the package graders.arena


@functools.cache
def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(GRADERS.rglob("*.py")):
        if path.parent == GRADERS and path.name != "__init__.py":
            found[ENTRY_POINT + path.name] = path
            continue
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(path: Path, name: str) -> set[str]:
    """The graders modules `path` imports (relative imports resolved), at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            found.add(base)
            if base != "graders.run":  # `from graders.run import harness` speaks the vocabulary, as kata graders must
                found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name == "graders" or name.startswith("graders.")}


def resolved(target: str, known: dict[str, Path]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def layer(module: str) -> str:
    if module.startswith(ENTRY_POINT):
        return ""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in MAY_IMPORT) else ""


@functools.cache
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {t for target in imports_of(path, name) if (t := resolved(target, known)) and t != name}
            for name, path in known.items()}


def test_every_package_has_a_layer():
    assert {layer(m) for m in modules()} <= set(MAY_IMPORT)


@pytest.mark.parametrize("module", sorted(modules()))
def test_imports_run_downward(module):
    mine = layer(module)
    wrong = sorted(t for t in graph()[module] if layer(t) != mine and layer(t) not in MAY_IMPORT[mine]
                   and t != "graders")
    if mine == "katas":  # a kata grader speaks the run path's vocabulary: graders.run itself
        wrong += sorted(t for t in graph()[module] if layer(t) == "run" and t != "graders.run")
    assert not wrong, (f"{module} (layer {mine or 'entry points'!r}) imports {', '.join(wrong)}; "
                       f"it may import only {sorted(MAY_IMPORT[mine]) or 'the standard library'} of the graders")


def test_no_import_circle():
    edges = graph()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                circle = path[path.index(target):] + [target]
                pytest.fail("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target, path + [target])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])


def test_frame_needs_no_tensor_library():
    for name, path in modules().items():
        if layer(name) == "frame":
            tree = ast.parse(path.read_text())
            imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
                (n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert "torch" not in imported, f"{name} imports torch; the frame is read by commands that need no tensors"


def test_no_module_is_over_the_limit():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_module_says_what_it_may_import():
    silent = [name for name, path in modules().items()
              if layer(name) != "katas" and "May import" not in (ast.get_docstring(ast.parse(path.read_text())) or "")]
    assert not silent, f"modules whose docstring does not say what they may import: {silent}"
