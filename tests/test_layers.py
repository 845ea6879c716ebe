"""The project's layers point one way: colibri_build <- colibri (the binding) <- tuner
<- colibri_bench.

Read from the source (every import statement, those inside functions included), so a
lazy import cannot hide a cycle or a dependency against the flow."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# a package may import only the packages listed for it (and the standard library and
# third-party modules, which are not checked here)
ALLOWED = {
    "colibri_build": set(),
    "colibri": {"colibri_build"},
    "tuner": {"colibri_build", "colibri"},
    "colibri_bench": {"colibri_build", "colibri", "tuner"},
}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in ALLOWED:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


MODULES = _modules()


def _known(name: str) -> str | None:
    """The project module `name` lives in (itself, or the package holding the attribute)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(mod: str, source: str, is_package: bool = False) -> set[str]:
    """The project modules `mod` imports, anywhere in its source. `from P import x` with x
    a submodule depends on P.x alone when P is one of mod's own parent packages (those are
    initialised first anyway); otherwise on P too, which runs P's __init__."""
    package = mod.split(".") if is_package else mod.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {m for a in node.names if (m := _known(a.name))}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module
            subs = {f"{src}.{a.name}" for a in node.names if f"{src}.{a.name}" in MODULES}
            out |= subs
            if len(subs) < len(node.names) or not mod.startswith(src + "."):
                if (m := _known(src)):
                    out.add(m)
    out.discard(mod)
    return out


GRAPH = {m: imports_of(m, f.read_text(), f.name == "__init__.py") for m, f in MODULES.items()}


def against_the_flow(graph) -> list[str]:
    return sorted(f"{m} imports {t}" for m, ts in graph.items() for t in ts
                  if t.split(".")[0] != m.split(".")[0]
                  and t.split(".")[0] not in ALLOWED[m.split(".")[0]])


def cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_project_modules():
    assert cycles(GRAPH) == []


def test_packages_import_only_the_layers_below():
    assert against_the_flow(GRAPH) == []


def test_the_checks_find_a_lazy_import_against_the_flow_and_a_cycle():
    planted = {m: set(ts) for m, ts in GRAPH.items()}
    planted["colibri._lib"] |= imports_of("colibri._lib", "def f():\n    from tuner import run\n")
    planted["tuner.run"] |= imports_of("tuner.run", "from colibri import _lib\n")
    assert "colibri._lib imports tuner.run" in against_the_flow(planted)
    assert any({"colibri._lib", "tuner.run"} <= set(c) for c in cycles(planted))
