"""What a new user expects in the first hour (issue 37), as the Dockerfile and environment.yml declare it: the
everyday tools in the runtime's apt layer, set up for every user, and the widgets and science stack pinned."""

import re
from pathlib import Path

from buildtools import envspec  # the repository root is on pytest's pythonpath (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
# Debian's names; tests/image/test_workstation.py runs each one as the user over SSH.
EVERYDAY_TOOLS = [
    "curl",
    "wget",
    "unzip",
    "zip",
    "vim-tiny",
    "htop",
    "jq",
    "make",
    "git-lfs",
    "less",
    "openssh-client",
    "fonts-liberation",
]
NOTEBOOK_PACKAGES = [
    "ipywidgets",
    "ipympl",
    "jupyterlab-git",
    "pandas",
    "scipy",
    "scikit-learn",
    "scikit-image",
    "seaborn",
]


def runtime_apt_layer():
    """The runtime stage's RUN instruction that installs Debian packages, its continuation lines joined."""
    runtime = (ROOT / "Dockerfile").read_text().split(" AS runtime\n", 1)[1]
    instructions = re.split(r"\n(?=[A-Z]+ )", runtime.replace("\\\n", " "))
    [layer] = [text for text in instructions if text.startswith("RUN ") and "apt-get install" in text]
    return layer


def test_the_everyday_tools_are_in_the_runtime_apt_layer_without_recommends():
    layer = runtime_apt_layer()
    install = re.search(r"apt-get install -y --no-install-recommends ([^&]+)&&", layer)
    assert install, f"the runtime's apt-get install has no --no-install-recommends: {layer}"
    missing = set(EVERYDAY_TOOLS) - set(install.group(1).split())
    assert not missing, f"not in the runtime's apt layer: {sorted(missing)}"


def test_git_lfs_is_set_up_for_every_user_in_the_same_layer():
    # --system writes the lfs filters into /etc/gitconfig, which every user's git reads.
    assert "git lfs install --system" in runtime_apt_layer()


def test_the_widgets_and_the_science_stack_are_pinned():
    pins = envspec.conda_pins(ROOT / "environment.yml")
    assert not set(NOTEBOOK_PACKAGES) - set(
        pins
    ), f"not pinned in environment.yml: {set(NOTEBOOK_PACKAGES) - set(pins)}"
    assert int(pins["ipywidgets"].split(".")[0]) >= 8, "ipywidgets 8 brings the Notebook 7 / Lab extension"


def test_train_py_keeps_its_plain_text_progress():
    # With ipywidgets in the env, tqdm.auto (and tqdm.notebook) draw widgets under a kernel: train.py's progress,
    # in files and on terminals, stays tqdm's plain bar.
    sources = {
        path.relative_to(ROOT): path.read_text() for path in [ROOT / "train.py", *(ROOT / "torchlab").rglob("*.py")]
    }
    widget_bars = [
        str(path) for path, text in sources.items() if re.search(r"\btqdm\.(auto|notebook|autonotebook)\b", text)
    ]
    assert not widget_bars, f"these import tqdm's notebook bar: {widget_bars}"
    assert "from tqdm import tqdm" in sources[Path("torchlab/metrics.py")]
