"""docker-compose.yml brought up with a real compose tool: SSH and Jupyter work, and after
down/up the host keys and the user's files are the same."""

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from helpers.docker import IMAGE, Container, docker
from helpers.jupyter import api
from helpers.ssh import ssh

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = os.environ.get("COMPOSE", "docker-compose")


@pytest.fixture
def compose(tmp_path, ssh_key):
    if shutil.which(COMPOSE) is None:
        pytest.skip(f"{COMPOSE} is not installed on this host")
    token = "compose-" + uuid.uuid4().hex
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "key.pub").write_text(ssh_key[1] + "\n")
    (tmp_path / "data").mkdir()
    env = {
        **os.environ,
        "TORCHLAB_IMAGE": IMAGE,
        "JUPYTER_HOST_PORT": "0",  # Docker picks both host ports; Container.host_port reads them back
        "SSH_HOST_PORT": "0",
        "DATA": str(tmp_path / "data"),
        "JUPYTER_TOKEN_PATH": str(tmp_path / "token"),
        "SSH_PUBLIC_KEY_PATH": str(tmp_path / "key.pub"),
        "SHM_SIZE": "1g",
    }
    project = "torchlab-test-" + uuid.uuid4().hex[:8]

    def run(*args):
        command = [COMPOSE, "-p", project, "-f", str(ROOT / "docker-compose.yml"), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, check=True).stdout

    yield run, token
    subprocess.run(
        [COMPOSE, "-p", project, "-f", str(ROOT / "docker-compose.yml"), "down", "-v", "-t", "2"],
        env=env,
        capture_output=True,
        timeout=180,
        check=False,
    )


def test_compose_up_down_up_keeps_host_keys_and_files(compose, ssh_key):
    run, token = compose
    run("up", "-d")
    first = Container(run("ps", "-q").strip())
    first.wait_ready()
    assert api(first, "/api/status", token=token)["started"]
    host_key = ssh(first, ssh_key[0], "cat /etc/ssh/host_keys/ssh_host_ed25519_key.pub").stdout
    ssh(first, ssh_key[0], "echo kept > /workspace/mine.txt && test -r /data && ! touch /data/x 2>/dev/null")
    inspect = docker("inspect", first.name).stdout
    assert token not in inspect  # a secret file, not an environment variable
    run("down", "-t", "2")

    run("up", "-d")
    second = Container(run("ps", "-q").strip())
    second.wait_ready()
    assert second.name != first.name
    assert ssh(second, ssh_key[0], "cat /etc/ssh/host_keys/ssh_host_ed25519_key.pub").stdout == host_key
    assert ssh(second, ssh_key[0], "cat /workspace/mine.txt").stdout == "kept\n"
    assert api(second, "/api/status", token=token)["started"]
