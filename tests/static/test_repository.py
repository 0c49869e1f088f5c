"""Static checks of what cannot be built here: the production (conda, CUDA 11.8) path of the
Dockerfile and the env it creates, which is environment.yml itself."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from buildtools import envspec  # the repository root is on pytest's pythonpath (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENT = ROOT / "environment.yml"
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_every_dependency_is_pinned_exactly():
    lines = ENVIRONMENT.read_text().split("dependencies:\n", 1)[1].splitlines()
    deps = [line.split("#")[0].strip() for line in lines if line.strip().startswith("- ")]
    for dep in deps:
        assert re.fullmatch(r"- [A-Za-z0-9_.\-]+=\d+(\.\d+)+", dep), f"{dep!r} is not pinned exactly"
    assert len(deps) == len(envspec.conda_pins(ENVIRONMENT))


def test_pins_name_the_promised_stack():
    pins = envspec.conda_pins(ENVIRONMENT)
    assert pins["python"].startswith("3.10.")
    assert (pins["pytorch"], pins["torchvision"], pins["torchaudio"]) == ("2.5.1", "0.20.1", "2.5.1")
    assert pins["pytorch-cuda"] == "11.8"
    assert pins["notebook"].startswith("7.")
    for name in [
        "ipykernel",
        "pytest",
        "hypothesis",
        "numpy",
        "pillow",
        "matplotlib",
        "jupyterhub",
        "jupyter-server-proxy",
        "tensorboard",
    ]:
        assert name in pins


def test_channels_avoid_anaconda_defaults():
    text = ENVIRONMENT.read_text()
    channels = re.search(r"^channels:\n((?:\s+- .*\n)+)", text, re.M).group(1)
    names = [line.split("-", 1)[1].split("#")[0].strip() for line in channels.splitlines()]
    assert names == ["pytorch", "nvidia", "conda-forge", "nodefaults"]


def requirements(group, *flavour):
    out = subprocess.run(
        [sys.executable, str(ROOT / "buildtools/envspec.py"), "requirements", *flavour, group, str(ENVIRONMENT)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("==") for line in out.split())


def test_pypi_requirements_are_the_same_pins():
    torch, rest = requirements("torch"), requirements("rest")
    assert torch == {"torch": "2.5.1", "torchvision": "0.20.1", "torchaudio": "2.5.1"}
    pins = envspec.conda_pins(ENVIRONMENT)
    for name in set(pins) - envspec.CONDA_ONLY - {"pytorch", "torchvision", "torchaudio"}:
        assert rest[name] == pins[name]
    assert not set(rest) & {"python", "pytorch-cuda", "mkl", "pytorch"}


def flavour_table():
    lines = [line for line in (ROOT / "buildtools/flavours.tsv").read_text().splitlines() if not line.startswith("#")]
    header, *rows = (line.split("\t") for line in lines)
    return [dict(zip(header, row, strict=True)) for row in rows]


def test_the_current_flavour_takes_its_own_pins_and_the_rest_as_written():
    torch, rest = requirements("torch", "--flavour", "current"), requirements("rest", "--flavour", "current")
    assert torch == {"torch": "2.15.0", "torchvision": "0.29.2", "torchaudio": "2.11.1"}
    assert (rest["numpy"], rest["scikit-image"]) == ("2.2.6", "0.25.2")
    assert rest["notebook"] == requirements("rest")["notebook"]
    assert envspec.conda_pins(ENVIRONMENT, "current")["python"] == "3.13"


def test_every_flavour_default_is_the_tables_first_row():
    """The flavour table is the one list: its first row is the default of make, the Dockerfile and envspec, the
    brief's base is the Dockerfile's, and environment.yml's notes name only its flavours."""
    table = flavour_table()
    default = table[0]["flavour"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^FLAVOUR \?= (\w+)##", makefile, re.M).group(1) == default
    assert re.search(r"^ARG FLAVOUR=(\w+)$", DOCKERFILE, re.M).group(1) == default
    assert default == envspec.DEFAULT_FLAVOUR
    assert re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE, re.M).group(1) == table[0]["base"]
    noted = set(re.findall(r"\[(\w+)=", ENVIRONMENT.read_text().split("dependencies:", 1)[1]))
    assert noted and noted <= {row["flavour"] for row in table[1:]}


def test_production_path_uses_a_pinned_bookworm_miniconda_and_asserts_cuda_11_8():
    tag = re.search(r"^ARG MINICONDA_IMAGE=continuumio/miniconda3:(\S+)$", DOCKERFILE, re.M).group(1)
    version = tuple(int(part) for part in re.split(r"[.-]", tag))
    assert (24, 4, 0, 0) <= version <= (25, 3, 1, 1), f"{tag} is not a Debian bookworm Miniconda"
    assert 'conda env create --name torchlab --file "/tmp/torchlab/${LOCK_FILE:-environment.yml}"' in DOCKERFILE
    assert "check --cuda 11.8" in DOCKERFILE
    assert re.search(r"^ARG ENV_SOURCE=conda$", DOCKERFILE, re.M)


def test_no_syntax_directive_and_no_ca_bundle_copied():
    assert not DOCKERFILE.startswith("# syntax")
    assert "ca_bundle" not in " ".join(line for line in DOCKERFILE.splitlines() if line.startswith(("COPY", "ADD")))
    assert all("id=ca_bundle" in line for line in DOCKERFILE.splitlines() if "ca_bundle" in line and "mount" in line)


@pytest.mark.parametrize("broken", ["  - numpy\n", "  - numpy>=1.26\n"])
def test_envspec_rejects_what_is_not_an_exact_pin(tmp_path, broken):
    env = tmp_path / "environment.yml"
    env.write_text("name: x\ndependencies:\n  - python=3.10.15\n" + broken)
    assert "numpy" not in envspec.conda_pins(env)


def test_code_layers_come_after_every_heavy_layer():
    # A code-only change must rebuild in seconds: nothing slow may follow the code's COPY lines.
    lines = [line for line in DOCKERFILE.splitlines() if line.startswith(("RUN", "COPY", "FROM"))]
    first_code = min(i for i, line in enumerate(lines) if re.match(r"COPY (train|notebooks|entrypoint\.sh)", line))
    assert not [line for line in lines[first_code:] if line.startswith(("RUN", "FROM"))]
    assert any(line.startswith("FROM env-${ENV_SOURCE}") for line in lines[:first_code])


def canonical(name):
    """A PyPI project name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release_locks():
    version = (ROOT / "VERSION").read_text().strip()
    return sorted((ROOT / "locks").glob(f"py3*-cu*-{version}.*"))


def test_this_release_has_a_lock_file():
    assert release_locks(), "no locks/<python>-<cuda>-<VERSION>.* file: run `make export-env` and commit it"


def lock_flavour(lock):
    """The flavour a lock file is of, by its CUDA: py311-cu124-... is the brief's torch from PyPI."""
    cuda = re.match(r"py\d+-cu(\d+)-", lock.name).group(1)
    (flavour,) = [
        row["flavour"]
        for row in flavour_table()
        if cuda in {row["cuda"].replace(".", ""), row["pypi_cuda"].replace(".", "")}
    ]
    return flavour


@pytest.mark.parametrize("lock", release_locks(), ids=lambda path: path.name)
def test_release_lock_holds_every_pin_of_environment_yml(lock):
    flavour = lock_flavour(lock)
    if lock.suffixes[-2:] == [".conda", ".yml"]:
        locked = envspec.conda_pins(lock)
        wanted = envspec.conda_pins(ENVIRONMENT, flavour)
    else:
        lines = [line for line in lock.read_text().splitlines() if line.strip()]
        assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==\S+", line) for line in lines), "expected name==version lines"
        locked = {canonical(name): version.split("+")[0] for name, version in (line.split("==") for line in lines)}
        wanted = {canonical(name): version for name, version in envspec.pypi_pins(ENVIRONMENT, flavour).items()}
    stale = {name: (version, locked.get(name)) for name, version in wanted.items() if locked.get(name) != version}
    assert not stale, f"{lock.name} disagrees with environment.yml (pin, lock): {stale}; rerun make export-env"


def test_licence_label_agrees_with_the_licence_file():
    label = re.search(r'org\.opencontainers\.image\.licenses="([^"]+)"', (ROOT / "Dockerfile").read_text()).group(1)
    licence = (ROOT / "LICENSE").read_text()
    own = label.split(" AND ")[0]
    assert own == "BSD-3-Clause"
    assert licence.startswith("BSD 3-Clause License\n")
    assert "Neither the name of the copyright holder nor the names of its" in licence
    # What the image bundles under its own terms is named in the label and in the security page.
    assert "LicenseRef-NVIDIA-CUDA-EULA" in label.split(" AND ")[1:]
    security = (ROOT / "docs" / "security.md").read_text()
    assert "## Licences" in security and "BSD-3-Clause" in security


def test_the_documented_variable_table_is_made_from_the_start_variables_table():
    command = [sys.executable, str(ROOT / "buildtools" / "variables-doc"), "--check"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


# Upper-case names the start-up reads that the image or the start itself sets, not the operator.
START_INTERNALS = {
    "PATH",
    "PWD",
    "LD_PRELOAD",
    "PYTHONUSERBASE",
    "CONDA_ENVS_PATH",
    "JUPYTER_PATH",
    "JUPYTER_RUNTIME_DIR",
}
START_INTERNALS |= {
    "ROOT_PATH",
    "RUNTIME_DIR",
    "SECRET_VARIABLES",
    "OWN_VARIABLES",
    "JUPYTER_RESTARTS",
    "BASH_REMATCH",
    "SECONDS",
}
START_INTERNALS |= {"TORCHLAB_SECRETS_FD"}


def test_every_variable_the_start_reads_is_in_the_table():
    lines = (ROOT / "image" / "start" / "variables.tsv").read_text().splitlines()
    table = {line.split("\t")[0] for line in lines if line and not line.startswith("#")}
    start = "\n".join(path.read_text() for path in [ROOT / "entrypoint.sh", *(ROOT / "image" / "start").glob("*.sh")])
    read = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", start)) - START_INTERNALS
    assert read <= table, sorted(read - table)


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(markdown):
    """The anchors GitHub gives a page's headings: lower case, spaces as hyphens, other punctuation dropped."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_every_relative_link_in_the_docs_resolves(doc):
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_stays_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 200, f"README.md has {lines} lines: move detail into docs/"


def test_no_make_target_mounts_the_checkout():
    """Where Docker is reached through a mounted socket (a CI job container, a dev container), a bind mount names
    a path on the engine's host, which has no checkout there: the sources travel by `docker cp`."""
    makefile = (ROOT / "Makefile").read_text()
    assert not re.findall(r"-v +\$\(CURDIR\)(?:/tests\S*)?:", makefile)
    assert "| $(DOCKER_CLI) cp - $$id:/" in makefile
