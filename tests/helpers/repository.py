"""What the repository's one tables hold, read from their source without importing the package (no torch here):
the `torchlab` command table (torchlab/cli.py's COMMANDS) and the package's modules."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torchlab"


def commands():
    """{command: the module whose main() runs it}, in the table's order."""
    tree = ast.parse((PACKAGE / "cli.py").read_text())
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMMANDS" for t in node.targets)
    )
    return {key.value: value.elts[0].value for key, value in zip(table.keys, table.values, strict=True)}


def modules():
    """Every module of the package as a path under torchlab/ (`pipeline/gil.py`), less the packages' __init__.py."""
    return sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if path.name != "__init__.py")
