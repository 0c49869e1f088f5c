"""Hand-kept lists against the one table each is made from (issue 46): the `torchlab` command table
(torchlab/cli.py) against README's list, the tools' docstring and the modules that run them; the package's modules
against docs/training.md's file map and torchlab/__init__.py's map. Adding a subcommand means its module and its
table row; these tests name anything else that must change. Each check is a function, also run on a stale copy."""

import ast
import re

from helpers.repository import PACKAGE, ROOT, commands, modules

README = (ROOT / "README.md").read_text()
TRAINING = (ROOT / "docs/training.md").read_text()


def readme_commands(text):
    """The commands README's workflow names after "the `torchlab` command also has"."""
    sentence = re.search(r"the `torchlab` command also has (.*?), each with", text, flags=re.S).group(1)
    return set(re.findall(r"`([\w-]+)`", sentence))


def command_problems(table, readme, tools_doc):
    problems = []
    if readme_commands(readme) != set(table) - {"train"}:
        problems.append(f"README names {sorted(readme_commands(readme))}, the table {sorted(set(table) - {'train'})}")
    for command, module in table.items():
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.exists() or "def main(" not in path.read_text():
            problems.append(f"{command}: {module} has no main()")
        tool = module.removeprefix("torchlab.tools.")
        if tool != module and not re.search(rf"\b{tool}\b", tools_doc):
            problems.append(f"{command}: torchlab/tools/__init__.py does not name {tool}")
    return problems


def tools_docstring():
    return ast.get_docstring(ast.parse((PACKAGE / "tools/__init__.py").read_text()))


def test_every_command_is_named_wherever_commands_are_listed():
    assert set(commands()) >= {"train", "doctor", "env", "gpu-check"}
    assert command_problems(commands(), README, tools_docstring()) == []


def test_a_command_named_nowhere_else_is_caught():
    table = {**commands(), "shrink": "torchlab.tools.shrink"}
    assert command_problems(table, README, tools_docstring()) == [
        f"README names {sorted(readme_commands(README))}, the table {sorted(set(table) - {'train'})}",
        "shrink: torchlab.tools.shrink has no main()",
        "shrink: torchlab/tools/__init__.py does not name shrink",
    ]


def file_map(text):
    """The module paths docs/training.md's "Files" table names (`pipeline/gil.py`)."""
    section = text.split("\n## Files\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([\w/]+\.py)`", row)}


def module_map_problems(mapped, package_doc, all_modules):
    problems = [f"docs/training.md's file map lacks {name}" for name in all_modules if name not in mapped]
    problems += [
        f"docs/training.md's file map names {name}, which is not in torchlab/" for name in mapped - set(all_modules)
    ]
    stems = {name.rsplit("/", 1)[-1].removesuffix(".py") for name in all_modules} - {"__main__"}
    problems += [
        f"torchlab/__init__.py's map lacks {stem}"
        for stem in sorted(stems)
        if not re.search(rf"\b{stem}\b", package_doc)
    ]
    return problems


def package_docstring():
    return ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))


def test_the_file_maps_name_every_module_and_nothing_else():
    assert "pipeline/gil.py" in modules()
    assert module_map_problems(file_map(TRAINING), package_docstring(), modules()) == []


def test_a_module_left_off_the_maps_is_caught():
    stale = TRAINING.replace("| `pipeline/gil.py` |", "| `pipeline/old.py` |")
    problems = module_map_problems(file_map(stale), package_docstring().replace("gil (the", "(the"), modules())
    assert problems == [
        "docs/training.md's file map lacks pipeline/gil.py",
        "docs/training.md's file map names pipeline/old.py, which is not in torchlab/",
        "torchlab/__init__.py's map lacks gil",
    ]
