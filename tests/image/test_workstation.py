"""The first hour of a new user (issue 37), tried as that user in one running container: each everyday tool used
once over SSH, the science stack used in the env, jupyterlab-git's server answering, and, in a real browser, a
`tqdm.auto` bar rendered as a widget and a `%matplotlib widget` figure drawn on a canvas.

The browser's screenshot goes to $TORCHLAB_ARTIFACTS (default .cache/test-artifacts/).
"""

import shlex

import pytest

from helpers.browser import ARTIFACTS
from helpers.docker import wait_for
from helpers.jupyter import TOKEN, api, base_url, http_status
from helpers.ssh import ssh

# One real use of each of tests/static/test_workstation_spec.py's EVERYDAY_TOOLS: (shell command, expected output).
# Jupyter's /api answers without a token inside the container, so curl and wget fetch something real.
TOOL_USES = {
    "curl": ("curl -fsS http://127.0.0.1:8888/api", '"version"'),
    "wget": ("wget -qO- http://127.0.0.1:8888/api", '"version"'),
    "zip and unzip": (
        'cd "$(mktemp -d)" && echo packed > f.txt && zip -q f.zip f.txt && rm f.txt && unzip -q f.zip && cat f.txt',
        "packed",
    ),
    "vim-tiny": ('f=$(mktemp) && echo draft > "$f" && vim -es -c "s/draft/edited/" -c wq "$f" && cat "$f"', "edited"),
    "htop": ("htop --version", "htop 3."),
    "jq": ("""echo '{"tools": ["jq"]}' | jq -r '.tools[0]'""", "jq"),
    "make": ("""cd "$(mktemp -d)" && printf 'all:\\n\\t@echo made\\n' > Makefile && make""", "made"),
    # Set up for the user: without the filters in /etc/gitconfig the file would be committed as is, not as a pointer.
    "git-lfs": (
        'cd "$(mktemp -d)" && git init -q && git lfs track "*.bin" >/dev/null && head -c 1000 /dev/urandom > w.bin'
        " && git add .gitattributes w.bin && git -c user.name=t -c user.email=t@t commit -qm w && git lfs ls-files",
        "w.bin",
    ),
    "less": ("echo paged | less", "paged"),
    "openssh-client": ("ssh -V 2>&1", "OpenSSH_"),
    "fonts-liberation": (
        "python -c \"from matplotlib import font_manager; print(font_manager.findfont('Liberation Sans',"
        ' fallback_to_default=False))"',
        "LiberationSans-Regular.ttf",
    ),
}

SCIENCE = """
import io, numpy as np, pandas as pd, seaborn, skimage.transform
from scipy import stats
from sklearn.linear_model import LinearRegression
frame = pd.read_json(io.StringIO('{"step": 1, "loss": 3.0}\\n{"step": 2, "loss": 1.0}\\n'), lines=True)
fit = LinearRegression().fit(frame[["step"]], frame["loss"])
print(round(float(fit.coef_[0]), 3), stats.norm.cdf(0), skimage.transform.resize(np.ones((4, 4)), (2, 2)).shape)
"""


@pytest.mark.parametrize("tool", TOOL_USES)
def test_each_everyday_tool_works_for_the_user_over_ssh(services, ssh_key, tool):
    command, expected = TOOL_USES[tool]
    result = ssh(services, ssh_key[0], command, check=False)
    assert result.returncode == 0 and expected in result.stdout, f"{tool}: {command}\n{result.stdout}{result.stderr}"


def test_the_science_stack_works_in_the_env_over_ssh(services, ssh_key):
    result = ssh(services, ssh_key[0], "python -c " + shlex.quote(SCIENCE), check=False)
    assert result.stdout.split() == ["-2.0", "0.5", "(2,", "2)"], result.stdout + result.stderr


def test_jupyterlab_git_answers_behind_jupyters_login(services):
    settings = api(services, "/git/settings")
    assert settings["gitVersion"].startswith("2."), settings
    assert http_status(f"{base_url(services)}/git/settings") == 403


WIDGETS_NOTEBOOK = "widgets-check.ipynb"
WIDGET_CELLS = [
    "import time\nfrom tqdm.auto import tqdm\nfor _ in tqdm(range(50)):\n    time.sleep(0.01)",
    "%matplotlib widget\nimport matplotlib.pyplot as plt\nfigure, axis = plt.subplots(figsize=(4, 3))\n"
    "axis.plot([0, 1], [0, 1], color='#ff0000', linewidth=6)",
]
# What the page shows: tqdm's widget (an HBox of text, a progress bar and text), red pixels on ipympl's canvases,
# and what shows a failure (an error or a stderr output, and tqdm's fallback warning).
PAGE_STATE = """(() => {
    const notebook = document.querySelector('.jp-Notebook');
    const bars = [...document.querySelectorAll('.jp-OutputArea .widget-hbox')]
        .filter(box => box.querySelector('.widget-hprogress')).map(box => box.innerText);
    const red = [...document.querySelectorAll('.jp-OutputArea .jupyter-matplotlib canvas')]
        .filter(canvas => canvas.width > 0 && canvas.height > 0).map(canvas => {
            const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
            let count = 0;
            for (let i = 0; i < pixels.length; i += 4)
                if (pixels[i] > 200 && pixels[i + 1] < 80 && pixels[i + 2] < 80 && pixels[i + 3] > 200) count++;
            return count;
        });
    const failures = [...document.querySelectorAll(
        '[data-mime-type="application/vnd.jupyter.stderr"], .jp-OutputArea-output[data-mime-type*="error"]'
    )].map(output => output.innerText);
    return {bars, red, failures, text: notebook ? notebook.innerText : ''};
})()"""


def kernel_idle(container, name):
    return any(
        s["path"].endswith(name) and s["kernel"]["execution_state"] == "idle" for s in api(container, "/api/sessions")
    )


def settled(state):
    """Both outputs are shown, or a failure is."""
    return (state["bars"] and any(state["red"])) or state["failures"] or "IProgress" in state["text"]


def test_browser_shows_a_tqdm_widget_and_an_ipympl_canvas(services, browser_page):
    cells = [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": code}
        for code in WIDGET_CELLS
    ]
    content = {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}}}
    content |= {"nbformat": 4, "nbformat_minor": 5}
    api(services, f"/api/contents/{WIDGETS_NOTEBOOK}", method="PUT", body={"type": "notebook", "content": content})
    page = browser_page
    port = services.host_port(8888)
    page.call("Page.navigate", url=f"http://127.0.0.1:{port}/notebooks/{WIDGETS_NOTEBOOK}?token={TOKEN}")
    screenshot = ARTIFACTS / "workstation-widgets.png"
    try:
        wait_for(
            lambda: page.evaluate("document.querySelectorAll('.jp-Notebook .jp-CodeCell').length") == len(cells),
            120,
            "the notebook's cells in the page",
        )
        wait_for(lambda: kernel_idle(services, WIDGETS_NOTEBOOK), 120, "the notebook's kernel to start and be idle")
        page.menu_command("Run", "Run All Cells")
        # Until both have shown, or a failure has: then the asserts say which.
        wait_for(lambda: settled(page.evaluate(PAGE_STATE)), 120, "the progress widget and the figure's canvas")
        state = page.evaluate(PAGE_STATE)
        assert "IProgress not found" not in state["text"], state["text"][-2000:]
        assert not state["failures"], state["failures"]
        assert any("50/50" in bar for bar in state["bars"]), state["bars"]
        assert any(count > 100 for count in state["red"]), f"red pixels on each canvas: {state['red']}"
        # jupyterlab-git's front end: its menu in Notebook 7's menu bar.
        assert "Git" in page.evaluate("[...document.querySelectorAll('.lm-MenuBar-itemLabel')].map(e => e.textContent)")
    finally:
        page.screenshot(screenshot)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
