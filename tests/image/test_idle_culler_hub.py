"""A real JupyterHub with the real jupyterhub-idle-culler (PyPI), culling after 60 s (issue 44): a server that trains,
the run started over SSH, is not culled; an idle one is, and so is the training one once its run has ended.
The hub is test_jupyterhub's (DockerSpawner on the local engine), with the culler as its service; the servers
report their activity every 10 s (JUPYTERHUB_ACTIVITY_INTERVAL), as zero-to-jupyterhub's do every 300 s."""

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from helpers.docker import docker, wait_for
from helpers.jupyter import http_status
from helpers.ssh import SSH_OPTIONS
from test_jupyterhub import Hub, hub_config, tear_down_hub

pytestmark = pytest.mark.slow

CULL_AFTER = 60  # seconds
SAMPLE_DATA = "torchlab sample-data /tmp/sample-data --classes 2"
RUN = (
    "nohup python train.py --data /tmp/sample-data --arch resnet18 --image-size 48 --batch-size 16 --epochs 100 "
    "--run-dir /tmp/run > /tmp/train.log 2>&1 < /dev/null &"
)


def culler_settings(admin_token, ssh_key):
    culler = [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={CULL_AFTER}", "--cull-every=10"]
    return {
        "JupyterHub.services": [
            {"name": "torchlab-test", "api_token": admin_token},
            {"name": "idle-culler", "command": culler},
        ],
        "JupyterHub.load_roles": [
            {"name": "torchlab-test", "scopes": ["admin:users", "admin:servers"], "services": ["torchlab-test"]},
            {
                "name": "idle-culler",
                "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
                "services": ["idle-culler"],
            },
        ],
        "DockerSpawner.environment": {
            "DOCTOR_AT_START": "no",
            "SSH_PUBLIC_KEY": ssh_key[1],
            "JUPYTERHUB_ACTIVITY_INTERVAL": "10",
        },
    }


@pytest.fixture
def culling_hub(tmp_path, ssh_key):
    tag = uuid.uuid4().hex[:8]
    prefix = network = f"torchlab-cull-{tag}"
    docker("network", "create", network)
    process = None
    try:
        gateway = docker("network", "inspect", network, "-f", "{{(index .IPAM.Config 0).Gateway}}").stdout.strip()
        admin_token, password = uuid.uuid4().hex, uuid.uuid4().hex
        extra = culler_settings(admin_token, ssh_key)
        url = hub_config(tmp_path, gateway, network, admin_token, password, prefix, None, extra)
        log = tmp_path / "hub.log"
        with log.open("wb") as out:
            hub_command = [str(Path(sys.executable).parent / "jupyterhub"), "-f", "jupyterhub_config.py"]
            process = subprocess.Popen(hub_command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        hub = Hub(url, admin_token, password, prefix, log)
        wait_for(lambda: http_status(f"{url}/hub/api/") == 200, 60, "JupyterHub's API", hub.logs)
        yield hub
    finally:
        tear_down_hub(process, tmp_path, prefix, network)


def server_running(hub, user):
    return bool(hub.api(f"/users/{user}", hub.admin_token)[1]["servers"])


def start_server(hub, user):
    assert hub.api(f"/users/{user}", hub.admin_token, "POST")[0] == 201
    assert hub.api(f"/users/{user}/server", hub.admin_token, "POST")[0] == 202, hub.logs()

    def ready():
        spawn = hub.api(f"/users/{user}", hub.admin_token)[1]["servers"].get("")
        return spawn and spawn["ready"]

    wait_for(ready, 120, f"{user}'s server to be ready", hub.logs)


def ssh_to_server(hub, user, ssh_key, command):
    container = f"{hub.prefix}-{user}"
    address = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container).stdout
    target = ["-i", str(ssh_key[0]), "-p", "2222", f"jovyan@{address.strip()}"]
    subprocess.run(["ssh", *SSH_OPTIONS, *target, command], check=True, timeout=120, capture_output=True)


def test_the_idle_culler_spares_a_server_that_trains_over_ssh_and_culls_an_idle_one(culling_hub, ssh_key):
    hub = culling_hub
    start_server(hub, "ada")
    ssh_to_server(hub, "ada", ssh_key, SAMPLE_DATA)
    ssh_to_server(hub, "ada", ssh_key, RUN)
    start_server(hub, "bob")

    wait_for(lambda: not server_running(hub, "bob"), CULL_AFTER + 60, "the idle server to be culled", hub.logs)
    assert server_running(hub, "ada"), hub.logs()  # ada's started first, and trains
    ssh_to_server(hub, "ada", ssh_key, "pgrep -f 'train.py --data' >/dev/null && pkill -TERM -f 'train.py --data'")
    wait_for(lambda: not server_running(hub, "ada"), CULL_AFTER + 60, "the server to be culled after its run", hub.logs)
