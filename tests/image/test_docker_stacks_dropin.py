"""What a jupyter/docker-stacks user relies on: Jupyter's own Shut Down (and RESTARTABLE), NOTEBOOK_ARGS, a
base_url everywhere, the `work` mount below the home, auth that no option turns off by accident, and a
healthcheck that writes nothing to the log."""

import os

import pytest

from helpers.docker import IMAGE, NO_AUTH, docker, start_log, wait_for
from helpers.jupyter import TOKEN, http_status, jupyter_api
from helpers.ssh import ssh

AUTH = {"Authorization": f"token {TOKEN}"}


def jupyter_pids(container):
    return container.exec("pgrep", "-u", "jovyan", "-f", "jupyter-notebook", check=False).stdout.split()


def test_jupyters_shut_down_restarts_it_and_ssh_work_goes_on(containers, ssh_key):
    container = containers.run(env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]})
    ssh(container, ssh_key[0], "nohup sleep 600 >/dev/null 2>&1 &")
    port = container.host_port(8888)
    before = jupyter_pids(container)
    assert http_status(f"http://127.0.0.1:{port}/api/shutdown", AUTH, method="POST") == 200
    wait_for(lambda: "starting it again" in container.logs(), 30, "Jupyter's restart", container.logs)
    wait_for(lambda: http_status(f"http://127.0.0.1:{port}/api/status", AUTH) == 200, 60, "Jupyter again")
    assert container.state()["Running"] and jupyter_pids(container) != before
    assert ssh(container, ssh_key[0], "pgrep -x sleep").stdout.strip()  # the nohup'd work goes on
    restarted = [line for line in start_log(container.logs(), "INFO") if "starting it again" in line]
    assert len(restarted) == 1 and not start_log(container.logs(), "ERROR")


def test_restartable_no_keeps_docker_stacks_exit(containers):
    stopped = {"Jupyter exited with status 0; stopping": "RESTARTABLE=no stops the container, as asked"}
    container = containers.run(env={"JUPYTER_TOKEN": TOKEN, "RESTARTABLE": "no"}, allowed_log=stopped)
    http_status(f"http://127.0.0.1:{container.host_port(8888)}/api/shutdown", AUTH, method="POST")
    assert container.wait_exited(timeout=30) == 1
    assert "Jupyter exited with status 0; stopping the container" in start_log(container.logs(), "ERROR")


def test_a_jupyter_that_keeps_dying_stops_the_container(containers):
    gave_up = {"Jupyter exited 6 times within a minute": "the test kills every Jupyter it starts"}
    container = containers.run(env={"JUPYTER_TOKEN": TOKEN, "DOCTOR_AT_START": "no"}, allowed_log=gave_up)
    killed = set()

    def kill_the_next_jupyter():
        if not container.state()["Running"]:
            return True
        for pid in set(jupyter_pids(container)) - killed:
            container.exec("kill", "-KILL", pid, check=False)
            killed.add(pid)
        return False

    wait_for(kill_the_next_jupyter, 60, "the container to give up on Jupyter", container.logs)
    errors = start_log(container.logs(), "ERROR")
    assert errors == ["Jupyter exited 6 times within a minute, the last with status 137; stopping the container"]
    assert container.state()["ExitCode"] == 137


def api_at(container, prefix):
    return http_status(f"http://127.0.0.1:{container.host_port(8888)}{prefix}/api")


@pytest.mark.parametrize(
    ("env", "command"),
    [
        ({"NOTEBOOK_ARGS": "--ServerApp.base_url=/tests-base-url"}, ()),
        ({}, ("start-notebook.py", "--ServerApp.base_url=/tests-base-url")),
        ({"NB_USER": "testuser", "CHOWN_HOME": "1"}, ("start-notebook.py", "--ServerApp.base_url=/tests-base-url")),
        ({"JUPYTER_PORT": "8123"}, ("start-notebook.py", "--ServerApp.base_url=/tests-base-url")),
    ],
    ids=["NOTEBOOK_ARGS", "start-notebook.py", "NB_USER and CHOWN_HOME", "JUPYTER_PORT"],
)
def test_a_base_url_reaches_the_server_the_healthcheck_and_the_printed_urls(containers, env, command):
    env = {"JUPYTER_TOKEN": "", **env}
    container = containers.run("--health-interval=1s", env=env, command=command, ready=False)
    wait_for(lambda: container.state()["Health"]["Status"] == "healthy", 90, "a healthy container", container.logs)
    if "JUPYTER_PORT" not in env:
        assert api_at(container, "/tests-base-url") == 200 and api_at(container, "") == 404
    urls = [line for line in start_log(container.logs(), "INFO") if "?token=" in line]
    port = env.get("JUPYTER_PORT", "8888")
    assert [url.split("?")[0] for url in urls] == [
        f"Jupyter: http://127.0.0.1:{port}/tests-base-url/tree",
        f"TensorBoard: http://127.0.0.1:{port}/tests-base-url/tensorboard/",
    ]


def test_notebook_args_are_split_as_a_shell_would(containers):
    args = "--ServerApp.base_url=/a --ServerApp.shutdown_no_activity_timeout=0 --KernelManager.shutdown_wait_time='6.5'"
    container = containers.run(env={"JUPYTER_TOKEN": TOKEN, "NOTEBOOK_ARGS": args}, ready=False)
    wait_for(lambda: api_at(container, "/a") == 200, 90, "Jupyter at /a", container.logs)
    jupyter = container.exec("pgrep", "-n", "-u", "jovyan", "-f", "jupyter-notebook").stdout.strip()
    argv = container.exec("cat", f"/proc/{jupyter}/cmdline").stdout.split("\0")
    assert argv[-4:-1] == [
        "--ServerApp.base_url=/a",
        "--ServerApp.shutdown_no_activity_timeout=0",
        "--KernelManager.shutdown_wait_time=6.5",
    ]


def test_the_work_mount_below_the_home_is_in_jupyter_and_ssh(containers, ssh_key, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("from the host\n")
    os.chown(work, 1000, 100)
    os.chown(work / "mine.txt", 1000, 100)
    container = containers.run(
        "-v", f"{work}:/home/jovyan/work", env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}
    )
    base = f"http://127.0.0.1:{container.host_port(8888)}"
    root = {entry["name"] for entry in jupyter_api(base, "/api/contents", TOKEN)["content"]}
    assert "work" in root
    listed = {entry["name"] for entry in jupyter_api(base, "/api/contents/work", TOKEN)["content"]}
    assert listed == {"mine.txt"}
    jupyter_api(base, "/api/contents/work/saved.txt", TOKEN, "PUT", {"type": "file", "format": "text", "content": "x"})
    assert (work / "saved.txt").read_text() == "x" and (work / "saved.txt").stat().st_uid == 1000
    assert ssh(container, ssh_key[0], "cat ~/work/mine.txt").stdout == "from the host\n"


@pytest.mark.parametrize(
    ("env", "command"),
    [
        ({}, ("start-notebook.py", "--IdentityProvider.token=")),
        ({}, ("start-notebook.py", "--ServerApp.token", "")),
        ({"NOTEBOOK_ARGS": "--IdentityProvider.token=''"}, ()),
        ({"JUPYTER_NO_AUTH": "yes", "JUPYTER_TOKEN": "abc"}, ()),
    ],
    ids=["--IdentityProvider.token=", "--ServerApp.token ''", "NOTEBOOK_ARGS", "JUPYTER_NO_AUTH and a token"],
)
def test_an_option_that_turns_auth_off_is_refused(env, command):
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    result = docker("run", "--rm", *env_args, IMAGE, *command, check=False, timeout=60)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and start_log(result.stderr, "ERROR"), result.stderr


def test_a_hub_token_without_the_hubs_url_is_refused_in_one_line():
    # docs/docker-stacks.md: docker-stacks starts here, and jupyterhub-singleuser then serves without the hub's login.
    result = docker("run", "--rm", "-e", "JUPYTERHUB_API_TOKEN=abc", IMAGE, check=False, timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert start_log(result.stderr, "ERROR")[0].startswith("JUPYTERHUB_API_TOKEN is set but JUPYTERHUB_SERVICE_URL")


@pytest.mark.parametrize("user", ["root", "1000:100"])
def test_jupyter_env_vars_to_unset_as_docker_stacks_tests_it(user):
    # docker-stacks' test_jupyter_env_vars_to_unset (its run_and_wait fails on any WARNING line), here in both start
    # modes: the names are unset, and the advice about docker exec is an INFO line, not a WARNING (issue 44).
    env = {
        "JUPYTER_ENV_VARS_TO_UNSET": "SECRET_ANIMAL,UNUSED_ENV,SECRET_FRUIT",
        "FRUIT": "bananas",
        "SECRET_ANIMAL": "cats",
        "SECRET_FRUIT": "mango",
    }
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    line = "echo I like ${FRUIT} and ${SECRET_FRUIT:-stuff}, and love ${SECRET_ANIMAL:-to keep secrets}!"
    result = docker("run", "--rm", "--user", user, *env_args, IMAGE, "start.sh", "bash", "-c", line, timeout=60)
    assert result.stdout.strip() == "I like bananas and stuff, and love to keep secrets!"
    assert not start_log(result.stderr, "WARNING") and not start_log(result.stderr, "ERROR"), result.stderr
    advice = [line for line in start_log(result.stderr, "INFO") if "came in the container's environment" in line]
    assert len(advice) == 1 and advice[0].startswith("SECRET_ANIMAL SECRET_FRUIT "), result.stderr


def test_jupyter_no_auth_turns_auth_off_on_purpose_with_a_warning(containers):
    container = containers.run(env={"JUPYTER_NO_AUTH": "yes"}, allowed_log=NO_AUTH)
    assert http_status(f"http://127.0.0.1:{container.host_port(8888)}/api/contents") == 200
    warnings = start_log(container.logs(), "WARNING")
    assert len(warnings) == 1 and warnings[0].startswith("JUPYTER_NO_AUTH=yes: Jupyter runs with no token")
    # Nor does the start tell the user to log in with a token (issue 44).
    (login,) = [line for line in start_log(container.logs(), "INFO") if line.startswith("Jupyter: http")]
    assert login.endswith("(no login: JUPYTER_NO_AUTH=yes)") and "JUPYTER_TOKEN" not in login, login


def test_an_idle_container_writes_nothing_to_its_log(containers):
    container = containers.run("--health-interval=1s", env={"JUPYTER_TOKEN": TOKEN, "DOCTOR_AT_START": "no"})
    wait_for(lambda: container.state()["Health"]["Status"] == "healthy", 60, "a healthy container")
    settled = container.logs()
    seen = {entry["Start"] for entry in container.state()["Health"]["Log"]}
    wait_for(lambda: len({e["Start"] for e in container.state()["Health"]["Log"]} - seen) >= 5, 30, "5 more probes")
    assert container.logs() == settled
