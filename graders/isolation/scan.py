"""A static scan of a solution file for ways to change its own grade instead of earning it.

The scan reads the source with `ast` and never runs it, so the organiser's process can scan an
untrusted tree safely. It is the second line of defence behind the runtime guard
(graders/isolation/guard.py): a solution that reaches the grader's objects by introspection could undo the
guard, and introspection is exactly what this scan looks for. It flags:

- imports that give a graph pass no power over graphs, only over the process that grades it
  (sys, os, gc, ctypes, signal, importlib, pytest, the graders, timers outside kata 10, ...);
- builtins that run or reach code by name (eval, exec, compile, __import__, globals, vars, open, ...);
- frame and closure introspection (f_back, f_globals, __globals__, __subclasses__, _getframe, ...);
- monkeypatching: assigning to, deleting or setattr-ing an attribute of an imported module or of
  anything imported from one (time.perf_counter = ..., nn.Conv2d.forward = ..., torch.backends... = ...),
  including through a local alias (m = torch.nn; m.ReLU.forward = ...);
- global runtime settings that change how the baseline runs too (torch.set_num_threads, ...).

A finding is a sentence with a line number. The rules are public (docs/organisers.md lists them), so a team
can scan its tree before submitting: `uv run graders/scan.py DIR`.

May import: the standard library (it never runs what it reads).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

FORBIDDEN_MODULES = {
    "sys": "the interpreter's state (sys.modules, frames, hooks)",
    "os": "the environment and the file system",
    "gc": "every live object, the grader's included",
    "ctypes": "raw memory", "cffi": "raw memory",
    "builtins": "the builtins every module sees",
    "importlib": "importing modules by name", "imp": "importing modules by name",
    "signal": "the signals that stop a hanging check", "faulthandler": "the signals that stop a hanging check",
    "resource": "the process's memory and CPU limits",
    "threading": "background threads that outlive the pass", "_thread": "background threads",
    "multiprocessing": "other processes", "subprocess": "other processes", "concurrent": "other processes",
    "socket": "the network", "urllib": "the network", "http": "the network",
    "shutil": "the file system", "tempfile": "the file system", "pathlib": "the file system",
    "io": "files", "pickle": "loading code from bytes", "marshal": "loading code", "types": "building code objects",
    "atexit": "code that runs after grading", "unittest": "mock.patch", "mock": "mock.patch",
    "pytest": "the test runner", "_pytest": "the test runner", "pytest_timeout": "the test runner",
    "graders": "the grader", "conftest": "the test runner's configuration", "katas": "the kata test files",
    "tests": "the project's tests", "reference": "the reference solutions",
}
TIMER_MODULES = {"time": "timers", "timeit": "timers", "torch.utils.benchmark": "the grader's timer"}
KATAS_THAT_TIME = {"10_verify_harness"}  # its task is a timing loop

FORBIDDEN_CALLS = {
    "eval": "runs code from a string", "exec": "runs code from a string", "compile": "builds code from a string",
    "__import__": "imports a module by name", "globals": "reaches module globals by name",
    "vars": "reaches an object's namespace", "locals": "reaches a frame's variables",
    "open": "opens files (the grader's results are files)", "breakpoint": "stops the grader",
    "setattr": None, "delattr": None,  # only on imported objects: see _scan_call
}
FORBIDDEN_ATTRIBUTES = {
    "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "gi_frame", "cr_frame", "ag_frame", "tb_frame",
    "_getframe",
    "__globals__", "__code__", "__closure__", "__builtins__", "__subclasses__", "__bases__", "__mro__",
    "__dict__", "__loader__", "__spec__", "__import__",
}
INSPECT_FRAMES = {"currentframe", "stack", "trace", "getouterframes", "getinnerframes", "getmembers"}
GLOBAL_SETTINGS = {"set_num_threads", "set_num_interop_threads", "set_flush_denormal", "set_default_dtype",
                   "use_deterministic_algorithms", "set_float32_matmul_precision", "set_grad_enabled"}


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


class _Scanner(ast.NodeVisitor):
    def __init__(self, kata: str | None):
        self.kata = kata
        self.findings: list[tuple[int, str]] = []
        self.imported: set[str] = set()   # names bound to a module or to something taken from one

    def flag(self, node: ast.AST, message: str) -> None:
        self.findings.append((node.lineno, message))

    def check_module(self, node: ast.AST, module: str) -> bool:
        top = module.split(".")[0]
        if top in FORBIDDEN_MODULES:
            self.flag(node, f"imports {module}, which reaches {FORBIDDEN_MODULES[top]}, not the graph")
            return True
        timer = next((t for t in TIMER_MODULES if module == t or module.startswith(t + ".")), None)
        if timer and self.kata not in KATAS_THAT_TIME:
            self.flag(node, f"imports {module}: a graph pass has no use for {TIMER_MODULES[timer]}")
            return True
        return False

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_module(node, alias.name)
            self.imported.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        if node.level:
            self.flag(node, f"imports relatively (from {module} import ...): a solution is a single file")
        elif module != "__future__":
            flagged = self.check_module(node, module)
            for alias in node.names:
                if not flagged:
                    self.check_module(node, f"{module}.{alias.name}")
                self.imported.add(alias.asname or alias.name)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            name = node.func.id
            if name in ("setattr", "delattr"):
                if node.args and _root_name(node.args[0]) in self.imported:
                    self.flag(node, f"calls {name} on {ast.unparse(node.args[0])}, an imported object: that changes "
                                    f"it for the grader too")
            else:
                self.flag(node, f"calls {name}(), which {FORBIDDEN_CALLS[name]}")
        timing_kata_sets_threads = self.kata in KATAS_THAT_TIME and "threads" in getattr(node.func, "attr", "")
        if isinstance(node.func, ast.Attribute) and node.func.attr in GLOBAL_SETTINGS \
                and _root_name(node.func) in self.imported and not timing_kata_sets_threads:
            self.flag(node, f"calls {ast.unparse(node.func)}, a process-wide setting that changes how the baseline "
                            f"runs too")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in FORBIDDEN_ATTRIBUTES:
            self.flag(node, f"uses .{node.attr}, which reaches frames, globals or classes behind the grader's back")
        elif node.attr in INSPECT_FRAMES and isinstance(node.value, ast.Name) and node.value.id == "inspect":
            self.flag(node, f"calls inspect.{node.attr}, which reaches the grader's frames")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__loader__", "__spec__"):
            self.flag(node, f"uses {node.id}")

    def check_target(self, target: ast.AST, verb: str) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.check_target(element, verb)
        elif isinstance(target, (ast.Attribute, ast.Subscript)) and _root_name(target) in self.imported:
            self.flag(target, f"{verb} {ast.unparse(target)}, part of an imported module: that monkeypatches it for "
                              f"the grader too")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self.check_target(target, "assigns to")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.check_target(node.target, "assigns to")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.check_target(node.target, "assigns to")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self.check_target(target, "deletes")
        self.generic_visit(node)


def _aliases(tree: ast.Module, imported: set[str]) -> set[str]:
    """Names assigned from an imported object (m = torch.nn; T = m.ReLU) count as imported too."""
    assigns = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and n.value]
    changed = True
    while changed:
        changed = False
        for node in assigns:
            if _root_name(node.value) not in imported or isinstance(node.value, ast.Call):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id not in imported:
                    imported.add(target.id)
                    changed = True
    return imported


def scan_source(source: str, filename: str = "solution.py", kata: str | None = None) -> list[str]:
    """Findings, one sentence each, in line order; [] when the file is clean (or does not parse:
    the grader reports a syntax error itself)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return []
    imports = _Scanner(kata)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.visit(node)
    scanner = _Scanner(kata)
    scanner.imported = _aliases(tree, set(imports.imported))
    scanner.visit(tree)
    return [f"{filename} line {line}: {message}." for line, message in sorted(set(scanner.findings))]


def scan_tree(tree: Path, katas: list[str]) -> dict[str, list[str]]:
    """Findings per kata for DIR/<kata>/solution.py (katas without a file are left out)."""
    found = {}
    for kata in katas:
        path = tree / kata / "solution.py"
        if path.is_file():
            found[kata] = scan_source(path.read_text(errors="replace"), f"{kata}/solution.py", kata)
    return found


def main(argv: list[str] | None = None) -> int:
    from graders.frame.catalogue import KATAS
    args = sys.argv[1:] if argv is None else argv
    tree = Path(args[0]) if args else Path("katas")
    findings = scan_tree(tree, list(KATAS))
    for kata, lines in findings.items():
        for line in lines:
            print(line)
    flagged = sum(bool(lines) for lines in findings.values())
    print(f"{tree}: {flagged} of {len(findings)} solution files flagged." if flagged else f"{tree}: clean.")
    return 1 if flagged else 0

