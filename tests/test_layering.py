"""The house rules as a test: layers import downward only, no import cycle, short functions.

Layers are folders, ranked bottom to top (docs/explanation/architecture.md, "Layers and
layout"; in the design of record, DESIGN.md outside the repository, §1 "Shape", its list
"Layers, top to bottom"):
    core/                       the base: config, storage, the run layout, records, model card
    tasks/ < alignment/ < training/ < decoding/ < serving/      the libraries
    amflow/                     the app: CLI, steps, job runners, orchestration, Airflow views
    bench/                      benchmarks (entry points: `amflow bench <what>`, `python -m bench.x`)
    dags/, plugins/             the wiring: Airflow's DAGs and its UI plugin
A module's rank is its top folder's; an import from a folder to a higher one is an arrow
running back up, and an import cycle between modules is a circle. Both fail here, whether
the import sits at module top or inside a function.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["core", "tasks", "alignment", "training", "decoding", "serving", "amflow", "bench",
          "dags", "plugins"]
LIBRARIES = ["tasks", "alignment", "training", "decoding", "serving"]
MAX_FUNCTION_LINES = 80


def _layer(module: str) -> str:
    """The folder a module lives in. Airflow imports dags/ and plugins/ modules by their bare
    names (`amflow_common`), so those are looked up among the files of those folders."""
    top = module.split(".")[0]
    if top in LAYERS:
        return top
    return "dags" if (ROOT / "dags" / f"{top}.py").exists() else "plugins"


def _rank(module: str) -> int:
    return LAYERS.index(_layer(module))


def _modules() -> dict[str, Path]:
    found = {}
    for top in LAYERS:
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if top in ("dags", "plugins"):
                parts = parts[1:]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(path: Path, known: set[str]) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(p, set(mods)) - {m} for m, p in mods.items()}


def test_no_arrow_runs_back_up(graph):
    up = sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps
                if _rank(b) > _rank(a))
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop(); on.discard(m); comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter[0]; counter[0] += 1
                stack.append(nxt); on.add(nxt)
                work.append((nxt, iter(sorted(graph.get(nxt, ())))))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return out


def test_no_import_cycle(graph):
    cycles = _cycles(graph)
    assert not cycles, f"import cycles: {cycles}"


def test_functions_are_short():
    long = []
    for top in LAYERS:
        if top in ("bench", "dags", "plugins"):
            continue
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_importing_the_steps_does_not_import_ray():
    """Ray fixes its client settings (the auth token of RAY_AUTH_TOKEN) when first imported,
    and costs seconds of start-up: the CLI and the step modules import it where they use it."""
    import subprocess
    import sys

    steps = sorted(p.stem for p in (ROOT / "amflow" / "steps").glob("*.py") if p.stem != "__init__")
    code = ("import sys, importlib; import amflow.cli\n"
            f"for s in {steps!r}: importlib.import_module('amflow.steps.' + s)\n"
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_libraries_never_take_a_step_context(graph):
    """The run layout is the app's: a library takes URIs, a Storage and typed plans, never
    the `core.runs.StepContext` that resolves runs/<id>/<step>/ (amflow/steps does)."""
    takers = []
    for top in LIBRARIES:
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "core.runs" and \
                        any(a.name == "StepContext" for a in node.names):
                    takers.append(str(path.relative_to(ROOT)))
    assert not takers, f"libraries importing StepContext: {takers}"


# The run layout (<root>/runs/<run_id>/<step>/_SUCCESS.json) has one home, core.runs, which
# the app uses; a library is handed the folders, frames and values it works on.
LAYOUT_MODULE = "core.runs"
LAYOUT_STRINGS = ("runs/", "_SUCCESS.json")


def test_libraries_never_import_the_run_layout(graph):
    takers = sorted(m for m, deps in graph.items()
                    if _layer(m) in LIBRARIES and LAYOUT_MODULE in deps)
    assert not takers, f"libraries importing {LAYOUT_MODULE}: {takers}"


def test_no_step_module_imports_another(graph):
    """Steps share services (amflow/services/), never each other: a step module used as a
    service drags its own run resolution into every step that borrows a function of it."""
    # the registry (amflow.steps.registry) lists the steps; it is not one of them
    steps = {m for m in graph if m.startswith("amflow.steps.") and m != "amflow.steps.registry"}
    found = sorted(f"{a} -> {b}" for a in steps for b in graph[a] & steps)
    assert not found, "step modules importing step modules:\n" + "\n".join(found)


def _layout_literals(source: str) -> list[str]:
    """The run-layout strings a module's code names: a string constant (docstrings aside)
    holding `runs/` or `_SUCCESS.json`, or a call given the folder name "runs" as an
    argument (join(root, "runs", run_id))."""
    tree = ast.parse(source)
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docs and any(s in node.value for s in LAYOUT_STRINGS):
            found.append(f"{node.lineno}: {node.value[:60]!r}")
        elif isinstance(node, ast.Call):
            found += [f"{a.lineno}: 'runs' as a path part" for a in node.args
                      if isinstance(a, ast.Constant) and a.value == "runs"]
    return found


def test_the_layout_literal_finder_finds_them():
    code = ('"""Docs may say runs/<R>/x/_SUCCESS.json."""\n'
            'A = join(root, "runs", rid)\nB = "_SUCCESS.json"\nC = f"{root}/runs/{rid}"\n'
            'D = {"runs": []}\n')
    assert [f.split(":")[0] for f in _layout_literals(code)] == ["2", "3", "4"]


def test_no_library_names_the_run_layout():
    named = []
    for top in LIBRARIES:
        for path in sorted((ROOT / top).rglob("*.py")):
            named += [f"{path.relative_to(ROOT)}:{f}" for f in _layout_literals(path.read_text())]
    assert not named, "library code naming the run layout:\n" + "\n".join(named)
