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

# Start-log lines that several tests expect, for their allowed_log ({regex: why}).
NO_AUTH = {r"^JUPYTER_NO_AUTH=yes: Jupyter runs with no token": "the operator turns Jupyter's auth off on purpose"}
SECRETS_IN_ENV = {r"came in the container's environment": "the test gives secrets with -e, which the start warns of"}
SERVICE_KILLED = {r"^(sshd|Jupyter) exited with status 137; stopping": "the test kills a service"}


def docker(*args, check=True, timeout=120, allowed_log=None, **kwargs):
    """Run the Docker CLI; text output; raise with stderr on failure when check. A `docker run` in the
    foreground that succeeds fails here if its start log has a WARNING or ERROR line that `allowed_log`
    ({regex: why}) does not name (ContainerFactory checks the detached ones)."""
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    options = args[: args.index(IMAGE)] if IMAGE in args else args  # not the container's command's own -d
    if args[0] == "run" and not {"-d", "--detach"} & set(options) and result.returncode == 0:
        unexpected = unexpected_log_lines(result.stdout + result.stderr, allowed_log or {})
        assert not unexpected, f"docker {' '.join(args)}: unexpected lines in the start log:\n" + "\n".join(unexpected)
    return result


def start_log(text, level):
    """The messages of the start log's `level` lines (INFO, WARNING, ERROR) in `text`: docker-stacks' format,
    LEVEL[YYYY-MM-DD HH:MM:SS] message."""
    pattern = re.compile(rf"^{level}\[\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\] (.*)$")
    return [match[1] for match in map(pattern.match, text.splitlines()) if match]


def unexpected_log_lines(text, allowed_log):
    """The start log's WARNING and ERROR lines in `text` that no pattern of `allowed_log` ({regex: why it is
    expected}) matches: docker-stacks' rule that a documented start logs neither unless a test says why."""
    return [
        f"{level}: {line}"
        for level in ("WARNING", "ERROR")
        for line in start_log(text, level)
        if not any(re.search(pattern, line) for pattern in allowed_log)
    ]


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
    picks, and removes every one it started, failing if its start log has a WARNING or ERROR line that the
    test did not name in `allowed_log` ({regex: why}) when it started it."""

    def __init__(self):
        self.started = {}

    def run(self, *docker_args, env=None, command=(), ready=True, shm_size="1g", allowed_log=None):
        name = f"torchlab-test-{uuid.uuid4().hex[:10]}"
        env_args = [arg for key, value in (env or {}).items() for arg in ("-e", f"{key}={value}")]
        options = ["-d", "--name", name, "--label", "torchlab.test=1", f"--shm-size={shm_size}"]
        ports = ["-p", "127.0.0.1::2222", "-p", "127.0.0.1::8888"]
        docker("run", *options, *ports, *env_args, *docker_args, IMAGE, *command)
        self.started[name] = allowed_log or {}
        container = Container(name)
        if ready:
            container.wait_ready()
        return container

    def remove_all(self):
        unexpected = []
        for name, allowed_log in self.started.items():
            logs = docker("logs", name, check=False)
            unexpected += [f"{name}: {line}" for line in unexpected_log_lines(logs.stdout + logs.stderr, allowed_log)]
            docker("rm", "-f", "-v", name, check=False)
        self.started = {}
        assert not unexpected, (
            "unexpected lines in the start log (a test that expects one names it in allowed_log):\n"
            + "\n".join(unexpected)
        )
