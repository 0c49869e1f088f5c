"""The package's layers point one way: cli -> config -> core -> tools, read from the source with ast (nothing is
imported, so no torch is needed).

The core (data, pipeline, model, checkpoint, metrics, optim, distributed, io, train, resolve) imports nothing of
tools or cli; config imports no torch, directly or through the torchlab modules it imports; and no folder or
top-level module of torchlab imports another that imports it back. Imports inside functions count too.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "torchlab"
CORE = {"data", "pipeline", "model", "checkpoint", "metrics", "optim", "distributed", "io", "train", "resolve"}
ABOVE_THE_CORE = ("torchlab.tools", "torchlab.cli")
TORCH = ("torch", "torchvision")


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def within(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


def imported_names(name):
    """Every module that `name`'s source imports (anywhere in it), absolute; a torchlab package also stands for
    its __init__, and `from torchlab.x import y` for torchlab.x.y where y is a module."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return names


def with_parents(name):
    """`name` and the packages above it, whose __init__ an import of it runs."""
    parts = name.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts) + 1)}


def imports_of(name):
    """What importing `name` imports itself: the modules it names and their parent packages."""
    return set().union(*(with_parents(imported) for imported in imported_names(name))) - {name}


def layer(name):
    """The folder or top-level module of torchlab that `name` belongs to (None for torchlab itself)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_core_imports_nothing_of_tools_or_cli():
    wrong = {
        f"{name} imports {imported}"
        for name in MODULES
        if layer(name) in CORE
        for imported in imported_names(name)
        if any(within(imported, above) for above in ABOVE_THE_CORE)
    }
    assert not wrong, sorted(wrong)


def test_config_imports_no_torch_directly_or_through_torchlab():
    reached, chain, todo = set(), {"torchlab.config": None}, ["torchlab.config"]
    while todo:
        name = todo.pop()
        for imported in imports_of(name):
            if imported in reached:
                continue
            reached.add(imported)
            chain[imported] = name
            if imported in MODULES:
                todo.append(imported)
    torch = sorted(name for name in reached if any(within(name, top) for top in TORCH))
    routes = []
    for name in torch:
        route = [name]
        while chain[route[-1]] is not None:
            route.append(chain[route[-1]])
        routes.append(" <- ".join(route))
    assert not routes, routes


def folder_graph():
    """{layer: layers it imports}, between torchlab's folders and top-level modules."""
    graph = {}
    for name in MODULES:
        if layer(name) is None:
            continue
        targets = {layer(imported) for imported in imports_of(name) if within(imported, "torchlab")}
        graph.setdefault(layer(name), set()).update(targets - {None, layer(name)})
    return graph


def find_cycle(graph):
    """One cycle of `graph` as a list of nodes (first == last), or None."""
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_between_folders_and_modules():
    cycle = find_cycle(folder_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_checks_see_the_imports_they_are_about():
    """The graph is read right: known arrows are found, so an empty result above means something."""
    graph = folder_graph()
    assert {"config", "pipeline", "data"} <= graph["train"] and "io" in graph["data"]
    assert {"torch", "torchlab.pipeline", "torchlab.pipeline.loader"} <= imports_of("torchlab.train")
