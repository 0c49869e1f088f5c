"""TensorBoard at /tensorboard/ on Jupyter's port (jupyter-server-proxy): refused without Jupyter's token, started
on the first request with it, listening on 127.0.0.1 inside the container only, and showing a train.py run's
scalars through its HTTP API and in a real browser (screenshot in $TORCHLAB_ARTIFACTS)."""

import json
import urllib.error
import urllib.request

import pytest

from helpers.browser import ARTIFACTS
from helpers.docker import wait_for
from helpers.jupyter import TOKEN, http_status

pytestmark = pytest.mark.slow

SAMPLE_DATA = "torchlab sample-data /workspace/sample-data"
SHORT_RUN = (
    "python /opt/torchlab/train.py --data /workspace/sample-data --arch resnet18 --image-size 48 "
    "--batch-size 16 --workers 2 --log-interval 2 --epochs 1 --max-steps 4"
)
AUTH = {"Authorization": f"token {TOKEN}"}
# The tags of the page's scalar cards (tf-scalar-card) and how many chart lines are drawn (svg path.line): they live
# in nested shadow roots, out of reach of a plain querySelector.
SCALAR_CARDS = """(() => {
    const cards = {tags: [], lines: 0};
    const walk = root => root.querySelectorAll('*').forEach(element => {
        if (element.tagName === 'TF-SCALAR-CARD') cards.tags.push(element.tag);
        if (element.tagName === 'path' && element.classList.contains('line')) cards.lines++;
        if (element.shadowRoot) walk(element.shadowRoot);
    });
    walk(document);
    return cards;
})()"""


def get_json(url):
    with urllib.request.urlopen(urllib.request.Request(url, headers=AUTH), timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def trained(module_containers):
    """A container whose default run dir holds a short train.py run (made in /workspace, as a session would:
    docker exec starts in /, the WORKDIR)."""
    container = module_containers.run(env={"JUPYTER_TOKEN": TOKEN})
    container.exec("sh", "-c", SAMPLE_DATA, user="jovyan")
    container.exec("sh", "-c", f"cd /workspace && {SHORT_RUN}", user="jovyan")
    return container


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None


def refusal(url, headers=None):
    """The status and Location of an answer to url, its redirect not followed."""
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return response.status, response.headers.get("Location")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Location")


def test_tensorboard_without_the_token_redirects_to_login(trained):
    base = f"http://127.0.0.1:{trained.host_port(8888)}"
    assert refusal(f"{base}/tensorboard/") == (302, "/login?next=%2Ftensorboard%2F")
    assert refusal(f"{base}/tensorboard/data/runs") == (302, "/login?next=%2Ftensorboard%2Fdata%2Fruns")
    wrong = {"Authorization": f"token wrong-{TOKEN}"}
    assert refusal(f"{base}/tensorboard/data/runs", wrong) == (302, "/login?next=%2Ftensorboard%2Fdata%2Fruns")
    assert http_status(f"{base}/tensorboard/data/runs", method="POST", data=b"") == 403


def test_tensorboard_lists_the_run_and_its_scalars(trained):
    base = f"http://127.0.0.1:{trained.host_port(8888)}/tensorboard"
    assert http_status(f"{base}/", AUTH) == 200  # starts TensorBoard, and waits for it
    with urllib.request.urlopen(f"{base}/?token={TOKEN}", timeout=30) as response:
        assert "<title>TensorBoard</title>" in response.read().decode()
    wait_for(lambda: get_json(f"{base}/data/runs") == ["default"], 60, "the run in TensorBoard's runs")
    tags = get_json(f"{base}/data/plugin/scalars/tags")["default"]
    for field in ("loss", "accuracy", "lr", "images_per_sec", "data_wait_frac"):
        assert f"train/{field}" in tags, tags
    listening = trained.exec("ss", "-Hltn").stdout.split("\n")
    tensorboard_ports = [line.split()[3] for line in listening if line and ":8888" not in line and ":2222" not in line]
    assert tensorboard_ports and all(address.startswith("127.0.0.1:") for address in tensorboard_ports), listening


def test_browser_shows_the_scalars_page(trained, browser_page):
    port = trained.host_port(8888)
    wait_for(lambda: http_status(f"http://127.0.0.1:{port}/tensorboard/data/runs", AUTH) == 200, 90, "TensorBoard")
    browser_page.call("Page.navigate", url=f"http://127.0.0.1:{port}/tensorboard/?token={TOKEN}#scalars")
    screenshot = ARTIFACTS / "tensorboard-scalars.png"
    try:

        def drawn():
            cards = browser_page.evaluate(SCALAR_CARDS)
            return cards["tags"] and cards["lines"] >= len(cards["tags"]) and cards

        cards = wait_for(drawn, 120, "the run's scalar cards with their chart lines")
        assert {"train/loss", "train/accuracy", "train/lr"} <= set(cards["tags"]), cards
    finally:
        browser_page.screenshot(screenshot)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
