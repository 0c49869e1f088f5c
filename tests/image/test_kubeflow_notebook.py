"""Kubeflow Notebooks (and OpenShift AI / Open Data Hub workbenches) start the image as the notebook controller
does, emulated with Docker since no cluster runs here: NB_PREFIX set, an empty volume at /home/jovyan (the
notebook's PVC), the environment of the shipped k8s/notebook/notebook.json. Once as the image's own user (a root
start, where a resource sets no runAsUser), once as --user 1000:100 --group-add 100 (the shipped resource's
runAsUser, runAsGroup and fsGroup). The user's work must land on that volume and outlive the container."""

import json
import urllib.request
import uuid
from pathlib import Path

import pytest

from helpers.docker import NO_AUTH, docker, wait_for
from helpers.jupyter import http_status, jupyter_api
from helpers.ssh import ssh
from test_persistent_installs import build_wheel

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = json.loads((ROOT / "k8s/notebook/notebook.json").read_text())
PREFIX = "/notebook/team/alice"  # what the controller sets: /notebook/<namespace>/<name>


def manifest_env():
    """The container's env as the shipped resource gives it (the controller adds NB_PREFIX)."""
    (container,) = NOTEBOOK["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item["value"] for item in container.get("env", [])}


def start_workbench(containers, volume, ssh_key, user_args):
    """A container started as the controller would start the pod; ready when SSH and Jupyter at the prefix answer."""
    env = {**manifest_env(), "NB_PREFIX": PREFIX, "SSH_PUBLIC_KEY": ssh_key[1]}
    # The resource turns auth off (its gateway authenticates); the start warns all the same, as it should.
    container = containers.run("-v", f"{volume}:/home/jovyan", *user_args, env=env, ready=False, allowed_log=NO_AUTH)
    url = f"http://127.0.0.1:{container.host_port(8888)}{PREFIX}"
    wait_for(lambda: container.ssh_ready() and http_status(f"{url}/api") == 200, 90, "the workbench", container.logs)
    return container, url


def save_notebook(url, name):
    """Save an empty notebook as the browser does with no token: Jupyter's _xsrf cookie echoed in X-XSRFToken."""
    with urllib.request.urlopen(f"{url}/tree", timeout=30) as page:
        cookies = [header.split(";", 1)[0] for header in page.headers.get_all("Set-Cookie") or []]
    xsrf = next(cookie.split("=", 1)[1] for cookie in cookies if cookie.startswith("_xsrf="))
    body = {"type": "notebook", "content": {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}}
    request = urllib.request.Request(
        f"{url}/api/contents/{name}",
        method="PUT",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Cookie": "; ".join(cookies), "X-XSRFToken": xsrf},
    )
    urllib.request.urlopen(request, timeout=30).close()


@pytest.mark.parametrize("user_args", [(), ("--user", "1000:100", "--group-add", "100")], ids=["image-user", "1000"])
def test_a_kubeflow_workbench_keeps_the_users_work_on_its_volume(containers, ssh_key, tmp_path, user_args):
    assert manifest_env().get("JUPYTER_NO_AUTH") == "yes"  # the resource turns Jupyter's auth off, explicitly
    volume = "torchlab-test-home-" + uuid.uuid4().hex[:8]
    wheel = build_wheel(tmp_path, "probe_kubeflow", "kept")
    try:
        first, url = start_workbench(containers, volume, ssh_key, user_args)
        # The UI at the prefix, and what the culler polls, without a token (the gateway authenticated).
        assert http_status(f"{url}/tree") == 200 and http_status(f"{url}/api/status") == 200
        assert jupyter_api(url, "/api/kernels", token="") == []
        assert http_status(f"http://127.0.0.1:{first.host_port(8888)}/tree") == 404  # nothing outside the prefix
        save_notebook(url, "kept.ipynb")
        docker("cp", str(wheel), f"{first.name}:/tmp/")
        ssh(first, ssh_key[0], f"pip install --user --no-index /tmp/{wheel.name}", timeout=120)
        docker("rm", "-f", first.name)

        second, url = start_workbench(containers, volume, ssh_key, user_args)
        listed = {item["name"] for item in jupyter_api(url, "/api/contents", token="")["content"]}
        assert {"kept.ipynb", "notebooks"} <= listed, listed
        probe = "import probe_kubeflow; print(probe_kubeflow.__file__)"
        assert ssh(second, ssh_key[0], f"python -c '{probe}'").stdout.startswith("/home/jovyan/.local/lib/")
        runs = ssh(second, ssh_key[0], "echo $TORCHLAB_RUNS; id -u").stdout.split()
        assert runs == ["/home/jovyan/runs", "1000"]
        # train.py in the login directory, on the PVC, is in no git work tree: its run records no warning of it
        # (git stops at the mount, "Stopping at filesystem boundary": issue 44).
        probe = "from torchlab import environment; print(environment.work_tree('/home/jovyan/train.py'))"
        assert ssh(second, ssh_key[0], f'python -c "{probe}"').stdout.strip() == "None"
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)
