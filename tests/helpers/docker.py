"""The Docker CLI and the containers the tests start: the image under test is $TORCHLAB_IMAGE
(default torchlab), the CLI is $DOCKER. Conditions are polled for (wait_for), never slept on."""

import json
import os
import re
import subprocess
import time
import uuid

from helpers.jupyter import http_status
from helpers.ssh import ssh_banner

IMAGE = os.environ.get("TORCHLAB_IMAGE", "torchlab")
DOCKER = os.environ.get("DOCKER", "docker")


def docker(*args, check=True, timeout=120, **kwargs):
    """Run the Docker CLI; text output; raise with stderr on failure when check."""
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def start_log(text, level):
    """The messages of the start log's `level` lines (INFO, WARNING, ERROR) in `text`: docker-stacks' format,
    LEVEL[YYYY-MM-DD HH:MM:SS] message."""
    pattern = re.compile(rf"^{level}\[\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\] (.*)$")
    return [match[1] for match in map(pattern.match, text.splitlines()) if match]


def wait_for(condition, timeout, what, on_timeout=lambda: ""):
    """Poll condition() until it returns a truthy value; fail naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{on_timeout()}")
        time.sleep(0.2)


def image_env():
    """The image's ENV as a dict."""
    config = json.loads(docker("image", "inspect", IMAGE).stdout)[0]["Config"]
    return dict(item.split("=", 1) for item in config["Env"])


class Container:
    def __init__(self, name):
        self.name = name

    def host_port(self, container_port):
        """The 127.0.0.1 port that Docker published container_port on (Docker picked it: see helpers.ports)."""
        out = docker("port", self.name, f"{container_port}/tcp").stdout.split()
        return int(out[0].rsplit(":", 1)[1])

    def logs(self):
        result = docker("logs", self.name, check=False)
        return result.stdout + result.stderr

    def inspect(self):
        return json.loads(docker("inspect", self.name).stdout)[0]

    def state(self):
        return self.inspect()["State"]

    def exec(self, *cmd, user="root", check=True):
        return docker("exec", "-u", user, self.name, *cmd, check=check)

    def wait_exited(self, timeout=30):
        wait_for(lambda: not self.state()["Running"], timeout, f"{self.name} to exit", self.logs)
        return self.state()["ExitCode"]

    def ssh_ready(self):
        return ssh_banner(self.host_port(2222)).startswith("SSH-2.0-")

    def jupyter_ready(self):
        return http_status(f"http://127.0.0.1:{self.host_port(8888)}/api") == 200

    def wait_ready(self, timeout=90):
        def ready():
            if not self.state()["Running"]:
                raise AssertionError(f"{self.name} exited early:\n{self.logs()}")
            return self.ssh_ready() and self.jupyter_ready()

        wait_for(ready, timeout, f"sshd and Jupyter in {self.name}", self.logs)


class ContainerFactory:
    """Starts containers of the image under test, SSH and Jupyter published on host ports Docker
    picks, and removes every one it started."""

    def __init__(self):
        self.names = []

    def run(self, *docker_args, env=None, command=(), ready=True, shm_size="1g"):
        name = f"torchlab-test-{uuid.uuid4().hex[:10]}"
        env_args = [arg for key, value in (env or {}).items() for arg in ("-e", f"{key}={value}")]
        options = ["-d", "--name", name, "--label", "torchlab.test=1", f"--shm-size={shm_size}"]
        ports = ["-p", "127.0.0.1::2222", "-p", "127.0.0.1::8888"]
        docker("run", *options, *ports, *env_args, *docker_args, IMAGE, *command)
        self.names.append(name)
        container = Container(name)
        if ready:
            container.wait_ready()
        return container

    def remove_all(self):
        for name in self.names:
            docker("rm", "-f", "-v", name, check=False)
