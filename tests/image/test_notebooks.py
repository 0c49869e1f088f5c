"""The notebooks: committed without outputs; each runs top to bottom in the image's Jupyter against the sample
data with no error and with its plots as images; and a real browser (headless Chromium, driven over the Chrome
DevTools Protocol) opens the first one, runs all its cells from the menu and finds the doctor's table.

The browser's screenshot goes to $TORCHLAB_ARTIFACTS (default .cache/test-artifacts/).
"""

import base64
import json
import os
import re
import urllib.request
from pathlib import Path

import pytest

from helpers.browser import ARTIFACTS
from helpers.docker import IMAGE, docker, start_log, wait_for
from helpers.jupyter import TOKEN, http_status

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CELL_TIMEOUT_S = 240
NOTEBOOK_TIMEOUT_S = 360
# What each notebook must show once it has run: images (its plots), and text or HTML that only a working run makes.
EXPECTED_OUTPUTS = {
    "01-environment-check.ipynb": {"images": 0, "contains": ['<table class="torchlab-doctor"', "doctor: "]},
    "02-data-and-loader.ipynb": {
        "images": 4,
        "contains": ["--workers", "4 classes", "python train.py --data", "skipped 3 unreadable samples of 3 files"],
    },
    "03-train-and-monitor.ipynb": {"images": 2, "contains": ["resumed from", "exited with status 0"]},
}


IMPORT_PATH_EDIT = re.compile(r"\bsys\.path\b")


def read_notebook(path):
    return json.loads(Path(path).read_text())


def code_cells(notebook):
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def test_committed_notebooks_carry_no_outputs_and_use_the_env_kernel():
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert [path.name for path in paths] == sorted(EXPECTED_OUTPUTS)
    for path in paths:
        notebook = read_notebook(path)
        assert notebook["nbformat"] == 4
        assert notebook["metadata"]["kernelspec"]["name"] == "python3", path.name
        for cell in code_cells(notebook):
            assert cell["outputs"] == [], f"{path.name} cell {cell.get('id')} has outputs: clear them"
            assert cell["execution_count"] is None, f"{path.name} cell {cell.get('id')} has an execution count"
        # The package is imported as installed: no cell edits the import path.
        assert "from torchlab" in "".join(code_cells(notebook)[0]["source"]), path.name
        assert not any(IMPORT_PATH_EDIT.search("".join(cell["source"])) for cell in code_cells(notebook)), path.name


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory):
    """The image's sample data set, generated on the host as the user who runs the tests, with the bad files users'
    folders hold: an empty .jpg, a truncated JPEG and a text file named .jpg (each notebook must get past them)."""
    folder = tmp_path_factory.mktemp("notebook-data")
    docker(
        *["run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}", "--entrypoint", "torchlab", "-v", f"{folder}:/out"],
        *[IMAGE, "sample-data", "/out/data"],
        timeout=300,
    )
    a_class = sorted((folder / "data" / "train").iterdir())[0]
    photo = next(a_class.glob("*.JPEG")).read_bytes()
    (a_class / "empty.jpg").write_bytes(b"")
    (a_class / "truncated.jpg").write_bytes(photo[: len(photo) // 2])
    (a_class / "text.jpg").write_text("not an image\n")
    return folder / "data"


@pytest.fixture(scope="module")
def notebook_container(module_containers, sample_data):
    """A running container with the sample data at /data and the notebooks in /workspace/notebooks."""
    container = module_containers.run("-v", f"{sample_data}:/data:ro", env={"JUPYTER_TOKEN": TOKEN})
    for name in EXPECTED_OUTPUTS:
        path = f"/workspace/notebooks/{name}"
        assert container.exec("test", "-f", path, check=False).returncode == 0, f"{path}: not seeded into /workspace"
    return container


def outputs_of(notebook):
    return [output for cell in code_cells(notebook) for output in cell["outputs"]]


def output_text(output):
    if "text" in output:
        return "".join(output["text"])
    return "".join("".join(value) for key, value in output.get("data", {}).items() if key.startswith("text/"))


@pytest.mark.parametrize("name", sorted(EXPECTED_OUTPUTS))
def test_notebook_runs_top_to_bottom_in_the_image(notebook_container, name):
    result = docker(
        *["exec", "-u", "jovyan", "-w", "/workspace/notebooks", notebook_container.name],
        *["jupyter", "nbconvert", "--to", "notebook", "--execute", f"--ExecutePreprocessor.timeout={CELL_TIMEOUT_S}"],
        *["--output-dir", "/tmp/executed", name],
        check=False,
        timeout=NOTEBOOK_TIMEOUT_S,
    )
    assert result.returncode == 0, f"{name} failed to run:\n{result.stderr[-4000:]}"
    executed = json.loads(notebook_container.exec("cat", f"/tmp/executed/{name}").stdout)
    outputs = outputs_of(executed)
    errors = [output for output in outputs if output["output_type"] == "error"]
    assert not errors, f"{name}: error outputs: {[error['ename'] + ': ' + error['evalue'] for error in errors]}"
    assert all(cell["execution_count"] for cell in code_cells(executed)), f"{name}: a cell did not run"
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(images) >= EXPECTED_OUTPUTS[name]["images"], f"{name}: {len(images)} plots came out as images"
    assert all(base64.b64decode(image["data"]["image/png"])[:8] == b"\x89PNG\r\n\x1a\n" for image in images)
    text = "\n".join(map(output_text, outputs))
    for expected in EXPECTED_OUTPUTS[name]["contains"]:
        assert expected in text, f"{name}: {expected!r} is not in its outputs:\n{text[-3000:]}"


def doctor_statuses(container):
    """{check name: status} from `torchlab doctor --json`, with the notebook's --data and --run-dir."""
    report = container.exec(
        "torchlab", "doctor", "--json", "--data", "/data", "--run-dir", "/workspace/runs", user="jovyan", check=False
    ).stdout
    return {check["name"]: check["status"] for check in json.loads(report)["checks"]}


def notebook_kernel_state(port, name="01-environment-check.ipynb"):
    """The execution state of the kernel of the page's session on `name`, from Jupyter's REST API; None without one."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/sessions", headers={"Authorization": f"token {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        sessions = json.loads(response.read())
    return next((s["kernel"]["execution_state"] for s in sessions if s["path"].endswith(name)), None)


def test_browser_runs_the_environment_notebook_and_shows_the_doctor_table(notebook_container, browser_page):
    page = browser_page
    port = notebook_container.host_port(8888)
    page.call(
        "Page.navigate", url=f"http://127.0.0.1:{port}/notebooks/notebooks/01-environment-check.ipynb?token={TOKEN}"
    )
    screenshot = ARTIFACTS / "01-environment-check.png"
    try:
        wait_for(
            lambda: page.evaluate("document.querySelectorAll('.jp-Notebook .jp-CodeCell').length") >= 4,
            120,
            "the notebook's cells in the page",
        )
        wait_for(lambda: notebook_kernel_state(port) == "idle", 120, "the notebook's kernel to start and be idle")
        page.menu_command("Run", "Run All Cells")
        rows = wait_for(
            lambda: page.evaluate("document.querySelectorAll('.jp-OutputArea table.torchlab-doctor tbody tr').length"),
            180,
            "the doctor's table in the notebook's outputs",
        )
        table = dict(
            page.evaluate(
                "[...document.querySelectorAll('table.torchlab-doctor tbody tr')]"
                ".map(r => [r.cells[1].textContent, r.dataset.status])"
            )
        )
        assert rows >= 8
        # The same verdict, row by row, as the doctor's own command for the notebook's data and run dir;
        # the container has no GPU (no --gpus), so the gpu row warns.
        assert table == doctor_statuses(notebook_container), page.evaluate(
            "document.querySelector('table.torchlab-doctor').innerText"
        )
        assert table["gpu"] == "warn"
        # The last cell ran too: all cells, not only the doctor's.
        wait_for(
            lambda: "GPU check skipped" in page.evaluate("document.querySelector('.jp-Notebook').innerText"),
            120,
            "the GPU check's output",
        )
        errors = page.evaluate(
            "document.querySelectorAll('[data-mime-type=\"application/vnd.jupyter.stderr\"]').length"
        )
        assert errors == 0, page.evaluate("document.querySelector('.jp-Notebook').innerText")[-3000:]
    finally:
        page.screenshot(screenshot)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lab_is_served_beside_notebook_and_jupyter_ui_picks_the_url(containers, browser_page):
    default = containers.run(env={"JUPYTER_TOKEN": TOKEN})
    assert http_status(f"http://127.0.0.1:{default.host_port(8888)}/lab?token={TOKEN}") == 200
    assert "/tree (log in with your JUPYTER_TOKEN" in default.logs()
    assert "Executing: jupyter notebook --ServerApp.port=8888" in start_log(default.logs(), "INFO")
    lab = containers.run(env={"DOCKER_STACKS_JUPYTER_CMD": "lab"})  # docker-stacks' name for JUPYTER_UI
    assert "Executing: jupyter lab --ServerApp.port=8888" in start_log(lab.logs(), "INFO")
    url = next(line.split("Jupyter: ", 1)[1] for line in lab.logs().splitlines() if "Jupyter: http" in line)
    assert "/lab?token=" in url
    port = lab.host_port(8888)
    browser_page.call("Page.navigate", url=url.replace(":8888/", f":{port}/"))
    screenshot = ARTIFACTS / "jupyterlab-launcher.png"
    try:
        # The launcher's element comes before its cards: the kernel list is a request of its own.
        launcher_text = "document.querySelector('.jp-Launcher')?.innerText ?? ''"
        wait_for(
            lambda: "Python 3" in browser_page.evaluate(launcher_text),
            120,
            "JupyterLab's launcher with a Python 3 kernel",
            lambda: browser_page.evaluate(launcher_text),
        )
    finally:
        browser_page.screenshot(screenshot)
