"""The package's layers point one way, read from the source with ast (nothing is imported, so no torch is needed):
each folder or top-level module of torchlab imports only from its own layer and those below it (LAYERS, bottom
first, as torchlab/__init__.py draws them); importing config imports no torch, directly or through the torchlab
modules it imports (a function's own imports run when it is called); and no folder or top-level module imports
another that imports it back. Elsewhere, imports inside functions count.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "torchlab"
# Bottom first: the foundations, the core mechanisms, train.py's flags, the run, the commands, the command table.
LAYERS = [
    {"io", "parsing", "machine", "flavour", "activity"},
    {"data", "pipeline", "model", "optim", "distributed", "checkpoint", "metrics", "environment"},
    {"config"},
    {"resolve", "train"},
    {"tools"},
    {"cli", "__main__", "jupyter_activity"},  # entry points: the command, and the Jupyter server extension
]
TORCH = ("torch", "torchvision")


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def within(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


def import_nodes(tree, on_import):
    """The import statements of `tree`: all of them, or (on_import) those that run when the module is imported,
    outside function bodies."""
    if not on_import:
        return ast.walk(tree)
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, FUNCTIONS))
    return nodes


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def imported_names(name, on_import=False):
    """Every module that `name`'s source imports (anywhere in it; on_import: when it is imported), absolute; a
    torchlab package also stands for its __init__, and `from torchlab.x import y` for torchlab.x.y where y is a
    module."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in import_nodes(ast.parse(path.read_text(), str(path)), on_import):
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


def imports_of(name, on_import=False):
    """What `name` imports itself (on_import: when it is imported): the modules it names and their parents."""
    return set().union(*(with_parents(imported) for imported in imported_names(name, on_import))) - {name}


def layer(name):
    """The folder or top-level module of torchlab that `name` belongs to (None for torchlab itself)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def layer_number(name):
    """Where `name`'s folder or top-level module stands in LAYERS (0: the bottom)."""
    return next(number for number, layer_names in enumerate(LAYERS) if layer(name) in layer_names)


def test_every_folder_and_module_of_torchlab_is_in_a_layer():
    placed = set().union(*LAYERS)
    assert {layer(name) for name in MODULES} - {None} == placed


def test_each_layer_imports_only_its_own_and_those_below():
    wrong = {
        f"{name} imports {imported}"
        for name in MODULES
        if layer(name) is not None
        for imported in imported_names(name)
        if within(imported, "torchlab") and layer(imported) is not None and layer_number(imported) > layer_number(name)
    }
    assert not wrong, sorted(wrong)


def test_config_imports_no_torch_directly_or_through_torchlab():
    reached, chain, todo = set(), {"torchlab.config": None}, ["torchlab.config"]
    while todo:
        name = todo.pop()
        for imported in imports_of(name, on_import=True):
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
    # create_loader imports the torch side when it is called, not when the package is imported.
    assert "torchlab.pipeline.public" in imported_names("torchlab.pipeline")
    assert "torchlab.pipeline.public" not in imported_names("torchlab.pipeline", on_import=True)
