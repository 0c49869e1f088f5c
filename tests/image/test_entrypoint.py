"""The entrypoint: bad input, users and UIDs, hooks, supervision, stop, health, host keys, logs."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers import repository
from helpers.docker import IMAGE, SERVICE_KILLED, docker, start_log, wait_for
from helpers.host import require_tool
from helpers.jupyter import http_status
from helpers.ssh import ssh

ROOT = Path(__file__).resolve().parents[2]
VALID_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHTmWNRvKaRQct6YqVuqpLkk6LXG67DlQVng1aLmhVdh valid@example"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"SSH_PUBLIC_KEY": "ssh-ed25519 not-base64 me@laptop"}, "SSH_PUBLIC_KEY"),
        ({"SSH_PUBLIC_KEY": "-----BEGIN OPENSSH PRIVATE KEY-----"}, "SSH_PUBLIC_KEY"),
        ({"PUBLIC_KEY": VALID_KEY + "\ngarbage"}, "PUBLIC_KEY line 2"),
        ({"NB_UID": "abc"}, "NB_UID"),
        ({"NB_UID": "0"}, "NB_UID"),
        ({"NB_GID": "-5"}, "NB_GID"),
        ({"NB_USER": "Bad User"}, "NB_USER"),
        ({"SSH_PORT": "70000"}, "SSH_PORT"),
        ({"JUPYTER_PORT": "http"}, "JUPYTER_PORT"),
        ({"SSH_PORT": "0"}, "SSH_PORT"),
        ({"SSH_PORT": "9000", "JUPYTER_PORT": "9000"}, "SSH_PORT and JUPYTER_PORT"),
        ({"GRANT_SUDO": "maybe"}, "GRANT_SUDO"),
        ({"JUPYTER_TOKEN": "a", "JUPYTER_PASSWORD": "b"}, "JUPYTER_TOKEN and JUPYTER_PASSWORD"),
        ({"JUPYTER_TOKEN_FILE": "/no/such/file"}, "JUPYTER_TOKEN_FILE"),
        ({"NB_GROUP": "Team!"}, "NB_GROUP"),
        ({"NB_GROUP": "users", "NB_GID": "2000"}, "NB_GROUP"),
        ({"CHOWN_EXTRA": "relative/path"}, "CHOWN_EXTRA"),
        ({"CHOWN_EXTRA": "/no/such/path"}, "CHOWN_EXTRA"),
        ({"CHOWN_EXTRA_OPTS": "--reference=/etc/shadow"}, "CHOWN_EXTRA_OPTS"),
        ({"CHOWN_HOME_OPTS": "-R; rm -rf /"}, "CHOWN_HOME_OPTS"),
        ({"JUPYTER_ENV_VARS_TO_UNSET": "GOOD,not-a-name"}, "JUPYTER_ENV_VARS_TO_UNSET"),
        ({"JUPYTER_ENV_VARS_TO_UNSET": "HF_TOKEN,PATH"}, "JUPYTER_ENV_VARS_TO_UNSET names PATH"),
        ({"JUPYTER_ENV_VARS_TO_UNSET": "LD_PRELOAD"}, "JUPYTER_ENV_VARS_TO_UNSET names LD_PRELOAD"),
        ({"JUPYTER_ENV_VARS_TO_UNSET": "PYTHONPATH"}, "JUPYTER_ENV_VARS_TO_UNSET names PYTHONPATH"),
        ({"JUPYTER_ENV_VARS_TO_UNSET": "NB_USER"}, "JUPYTER_ENV_VARS_TO_UNSET names NB_USER"),
        ({"NB_GROUP": "shadow"}, "NB_GROUP=shadow"),
        ({"NB_GROUP": "sudo"}, "NB_GROUP=sudo"),
        ({"NB_GROUP": "team", "NB_GID": "42"}, "NB_GROUP=team"),
        ({"JUPYTER_UI": "classic"}, "JUPYTER_UI"),
        ({"NB_UMASK": "rwx"}, "NB_UMASK"),
        ({"GEN_CERT": "yes"}, "GEN_CERT"),
        ({"DOCKER_STACKS_JUPYTER_CMD": "nbclassic"}, "DOCKER_STACKS_JUPYTER_CMD"),
    ],
)
def test_bad_input_stops_before_anything_starts(env, variable):
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    # With no command the services would start: a container that got that far would still be running.
    result = docker("run", "--rm", *env_args, IMAGE, check=False, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    errors = start_log(result.stderr, "ERROR")
    assert len(lines) == 1 and len(errors) == 1, result.stderr
    assert variable in errors[0] and "expected" in errors[0]
    output = result.stdout + result.stderr
    assert "made SSH host key" not in output and "Jupyter: http" not in output


def test_command_runs_as_the_user_after_setup():
    out = docker("run", "--rm", IMAGE, "sh", "-c", "id -un; id -u; id -g; pwd; command -v python").stdout.split()
    assert out == ["jovyan", "1000", "100", "/workspace", "/opt/env/bin/python"]


def test_nb_user_uid_and_gid_are_honoured():
    env = ["-e", "NB_USER=alice", "-e", "NB_UID=1234", "-e", "NB_GID=2345"]
    script = "id -un; id -u; id -g; echo $HOME; stat -c %u /home/alice"
    out = docker("run", "--rm", *env, IMAGE, "sh", "-c", script).stdout.split()
    assert out == ["alice", "1234", "2345", "/home/alice", "1234"]


def test_workspace_owner_is_adopted_when_nb_uid_is_not_given(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.chown(workspace, 4321, 4322)
    result = docker("run", "--rm", "-v", f"{workspace}:/workspace", IMAGE, "sh", "-c", "touch /workspace/made; id -u")
    assert result.stdout.split()[-1] == "4321"
    assert "/workspace belongs to UID 4321" in result.stderr
    made = (workspace / "made").stat()
    assert (made.st_uid, made.st_gid) == (4321, 4322)


def test_given_nb_uid_wins_over_the_workspace_owner(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir(mode=0o777)
    os.chown(workspace, 4321, 4321)
    not_theirs = {"could not copy the notebooks into /workspace": "the mounted /workspace is 4321's, not 1500's"}
    run = ("run", "--rm", "-e", "NB_UID=1500", "-v", f"{workspace}:/workspace", IMAGE, "id", "-u")
    out = docker(*run, allowed_log=not_theirs).stdout
    assert out.split()[-1] == "1500"


@pytest.mark.parametrize(("grant", "expected"), [("yes", 0), ("no", 1)])
def test_grant_sudo(grant, expected):
    result = docker("run", "--rm", "-e", f"GRANT_SUDO={grant}", IMAGE, "sudo", "-n", "true", check=False)
    assert result.returncode == expected


def test_chown_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    env = ["-e", "CHOWN_HOME=yes", "-e", "CHOWN_HOME_OPTS=-R"]
    stat = ["stat", "-c", "%u", "/home/jovyan", "/home/jovyan/notes.txt"]
    out = docker("run", "--rm", *env, "-v", f"{home}:/home/jovyan", IMAGE, *stat).stdout.split()
    assert out[-2:] == ["1000", "1000"]


def test_hooks_run_before_start(tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "10-source.sh").write_text("HOOK_SOURCED=yes\n")
    script = hooks / "20-run"
    script.write_text("#!/bin/sh\necho hook-ran-as-$(id -un)\n")
    script.chmod(0o755)
    result = docker("run", "--rm", "-v", f"{hooks}:/usr/local/bin/before-notebook.d:ro", IMAGE, "true")
    assert "hook-ran-as-root" in result.stdout
    assert "hook: sourcing /usr/local/bin/before-notebook.d/10-source.sh" in result.stderr


def test_a_failing_hook_is_logged_and_the_start_goes_on(tmp_path):
    """docker-stacks' semantics: a sourced hook's failing line does not end it, nor the start."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "10-fails.sh").write_text("export OTHER_VAR=456\nrun-unknown-command\necho $UNSET_VAR ran-on\n")
    (hooks / "20-last-line-fails.sh").write_text("run-unknown-command\n")
    script = hooks / "30-exits-1"
    script.write_text("#!/bin/sh\nexit 1\n")
    script.chmod(0o755)
    mount = f"{hooks}:/usr/local/bin/before-notebook.d:ro"
    failed = {r"^hook: .* has failed, continuing execution": "the hooks fail on purpose"}
    run = ("run", "--rm", "-v", mount, IMAGE, "sh", "-c", "echo OTHER_VAR=$OTHER_VAR")
    result = docker(*run, check=False, allowed_log=failed)
    assert result.returncode == 0, result.stderr
    assert "ran-on" in result.stdout and "OTHER_VAR=456" in result.stdout
    for name in ("20-last-line-fails.sh", "30-exits-1"):
        assert f"before-notebook.d/{name} has failed, continuing execution" in result.stderr
    assert "10-fails.sh has failed" not in result.stderr  # its last line succeeded


def test_docker_stacks_start_scripts_as_the_command_and_nb_umask(containers):
    ran = docker("run", "--rm", "-e", "NB_UMASK=002", IMAGE, "start.sh", "sh", "-c", "id -un; umask").stdout.split()
    assert ran == ["jovyan", "0002"]
    container = containers.run(
        env={"NB_UMASK": "0027"}, command=("start-notebook.py", "--ServerApp.shutdown_no_activity_timeout=0")
    )
    jupyter = container.exec("pgrep", "-n", "-u", "jovyan", "-f", "shutdown_no_activity_timeout=0").stdout.strip()
    assert "Umask:\t0027" in container.exec("cat", f"/proc/{jupyter}/status").stdout


def test_sshd_listens_on_ssh_port_alone(containers):
    container = containers.run(env={"SSH_PORT": "2223"}, ready=False)
    wait_for(lambda: "Server listening on :: port 2223" in container.logs(), 60, "sshd on 2223", container.logs)
    listening = container.exec("ss", "-Hltn").stdout.split()
    assert "0.0.0.0:2223" in listening and not [address for address in listening if address.endswith(":2222")]
    assert "Address already in use" not in container.logs()


def test_docker_stop_ends_both_services_within_2_seconds(containers):
    container = containers.run()
    # If the services were still up after 2 s, Docker would SIGKILL them: exit code 137.
    docker("stop", "-t", "2", container.name)
    assert container.state()["ExitCode"] == 0
    assert not container.state()["OOMKilled"]


@pytest.mark.parametrize("service", ["sshd", "jupyter"])
def test_container_exits_non_zero_when_a_service_dies(containers, service):
    # Jupyter is started again unless RESTARTABLE=no (test_docker_stacks_dropin.py).
    container = containers.run(env={"RESTARTABLE": "no"} if service == "jupyter" else {}, allowed_log=SERVICE_KILLED)
    pattern = "/usr/sbin/sshd -D" if service == "sshd" else "jupyter-notebook|jupyter notebook"
    container.exec("pkill", "-KILL", "-o", "-f", pattern)
    assert container.wait_exited(timeout=20) != 0
    assert "exited with status" in container.logs()


def test_healthcheck_follows_both_services(containers):
    # A proxy for the container's outgoing traffic is not one for the probe of 127.0.0.1.
    proxy = {"HTTP_PROXY": "http://proxy.invalid:3128", "HTTPS_PROXY": "http://proxy.invalid:3128"}
    container = containers.run("--health-interval=1s", "--health-start-period=60s", env=proxy)
    wait_for(lambda: container.state()["Health"]["Status"] == "healthy", 60, "a healthy container")
    assert container.exec("torchlab-healthcheck", check=False).returncode == 0
    image_check = json.loads(docker("image", "inspect", "-f", "{{json .Config.Healthcheck}}", IMAGE).stdout)
    assert image_check["Interval"] == 3 * 10**9  # docker-stacks' interval: healthy within seconds of the services
    # The same check pointed at a port where nothing answers, as when a service is down.
    for services in ("http://127.0.0.1:1/api\n2222", "http://127.0.0.1:8888/api\n1"):
        container.exec("sh", "-c", f"printf '{services}\\n' >/run/torchlab/services")
        assert container.exec("torchlab-healthcheck", check=False).returncode != 0


def test_healthcheck_fails_until_the_services_answer(containers, tmp_path):
    # A hook holds the start until the test lets it go: the services are not up, so nor is health.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "10-hold.sh").write_text("while [ ! -e /tmp/go ]; do sleep 0.1; done\n")
    container = containers.run("-v", f"{hooks}:/usr/local/bin/before-notebook.d:ro", ready=False)
    wait_for(lambda: "hook: sourcing" in container.logs(), 60, "the start to reach the hook", container.logs)

    assert container.exec("torchlab-healthcheck", check=False).returncode != 0
    container.exec("touch", "/tmp/go")
    wait_for(lambda: container.exec("torchlab-healthcheck", check=False).returncode == 0, 60, "the services")


def host_keys(container):
    require_tool("ssh-keyscan")
    result = subprocess.run(
        ["ssh-keyscan", "-t", "ed25519", "-p", str(container.host_port(2222)), "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.split()[-1]


def test_each_container_gets_its_own_host_keys(containers):
    assert host_keys(containers.run()) != host_keys(containers.run())


def test_host_keys_persist_in_a_volume(containers):
    volume = "torchlab-test-hostkeys-" + os.urandom(4).hex()
    try:
        first = containers.run("-v", f"{volume}:/etc/ssh/host_keys")
        key = host_keys(first)
        docker("rm", "-f", first.name)
        assert host_keys(containers.run("-v", f"{volume}:/etc/ssh/host_keys")) == key
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)


def test_key_from_public_key_alias_and_from_a_file(containers, ssh_key, tmp_path):
    alias = containers.run(env={"PUBLIC_KEY": ssh_key[1]})
    assert ssh(alias, ssh_key[0], "id -un").stdout.strip() == "jovyan"
    key_file = tmp_path / "key.pub"
    key_file.write_text(ssh_key[1] + "\n")
    from_file = containers.run("-v", f"{key_file}:/run/secrets/key:ro", env={"SSH_PUBLIC_KEY_FILE": "/run/secrets/key"})
    assert ssh(from_file, ssh_key[0], "id -un").stdout.strip() == "jovyan"


def test_mounted_authorized_keys_file_works(containers, ssh_key, tmp_path):
    keys = tmp_path / "authorized_keys"
    keys.write_text(ssh_key[1] + "\n")
    container = containers.run("-v", f"{keys}:/home/jovyan/.ssh/authorized_keys:ro")
    assert ssh(container, ssh_key[0], "id -un").stdout.strip() == "jovyan"
    assert "no public key given" not in container.logs()


def test_without_a_key_the_log_says_how_to_give_one(containers):
    assert "SSH_PUBLIC_KEY" in containers.run().logs()


def test_small_dev_shm_is_told_when_the_services_start(containers):
    logs = containers.run(shm_size="64m").logs()
    small = [line for line in start_log(logs, "INFO") if "--shm-size" in line]
    assert len(small) == 1 and "--ipc=host" in small[0] and "bus error" in small[0]
    assert not start_log(logs, "WARNING")  # a plain `docker run` (64 MB) logs no warning, as in docker-stacks
    assert "--shm-size" not in containers.run(shm_size="2g").logs()
    # A command's loader fits itself to /dev/shm and says so: `docker run IMAGE CMD` is not warned.
    command = docker("run", "--rm", "--shm-size=64m", IMAGE, "true")
    assert command.stderr == "", command.stderr


SUDO_SKIPPED = {"^GRANT_SUDO: skipped": "GRANT_SUDO=yes with a non-root --user: the WARNING is what is tested"}


def test_the_start_log_has_docker_stacks_levels_and_quiet_keeps_warnings_alone():
    setup = docker(
        "run", "--rm", "--user", "1000:100", "-e", "GRANT_SUDO=yes", IMAGE, "echo", "ran", allowed_log=SUDO_SKIPPED
    )
    assert setup.stdout == "ran\n"  # the start log is on stderr alone
    warnings = start_log(setup.stderr, "WARNING")
    assert len(warnings) == 1 and warnings[0].startswith("GRANT_SUDO: skipped"), setup.stderr
    root = docker("run", "--rm", "-e", "GRANT_SUDO=yes", IMAGE, "true").stderr
    assert start_log(root, "INFO") == ["GRANT_SUDO: jovyan may use sudo without a password"], root
    quiet_env = ["-e", "JUPYTER_DOCKER_STACKS_QUIET=1", "-e", "GRANT_SUDO=yes"]
    assert docker("run", "--rm", *quiet_env, IMAGE, "true").stderr == ""
    quiet = docker("run", "--rm", "--user", "1000:100", *quiet_env, IMAGE, "true", allowed_log=SUDO_SKIPPED).stderr
    assert start_log(quiet, "WARNING") == warnings and quiet.count("\n") == 1, quiet


def test_a_start_log_warning_no_test_expects_fails_the_test(containers):
    # docker-stacks' rule, kept by helpers.docker for every container a test starts, foreground or detached.
    skipped = ("--user", "1000:100", "-e", "GRANT_SUDO=yes")
    with pytest.raises(AssertionError, match="unexpected lines in the start log:\nWARNING: GRANT_SUDO: skipped"):
        docker("run", "--rm", *skipped, IMAGE, "true")
    container = containers.run(*skipped, command=("sleep", "60"), ready=False)
    wait_for(lambda: "GRANT_SUDO" in container.logs(), 60, "the start log", container.logs)
    with pytest.raises(AssertionError, match=f"{container.name}: WARNING: GRANT_SUDO: skipped"):
        containers.remove_all()
    expected = containers.run(*skipped, command=("sleep", "60"), ready=False, allowed_log=SUDO_SKIPPED)
    wait_for(lambda: "GRANT_SUDO" in expected.logs(), 60, "the start log", expected.logs)
    containers.remove_all()


def test_quiet_keeps_the_line_with_a_random_token(containers):
    # The one INFO line a quiet log keeps: the random token is printed nowhere else.
    container = containers.run(env={"JUPYTER_DOCKER_STACKS_QUIET": "1"})
    info = start_log(container.logs(), "INFO")
    assert [line.split("?token=")[0] for line in info] == [
        "Jupyter: http://127.0.0.1:8888/tree",
        "TensorBoard: http://127.0.0.1:8888/tensorboard/",
    ], info
    token = info[0].split("?token=")[1]
    port = container.host_port(8888)
    assert http_status(f"http://127.0.0.1:{port}/api/status", {"Authorization": f"token {token}"}) == 200


def test_jupyter_ui_is_honoured_and_wins_over_docker_stacks_name_for_it(containers):
    container = containers.run(env={"JUPYTER_UI": "lab", "DOCKER_STACKS_JUPYTER_CMD": "notebook"})
    info = start_log(container.logs(), "INFO")
    assert "Executing: jupyter lab --ServerApp.port=8888" in info
    assert any(line.startswith("Jupyter: http://127.0.0.1:8888/lab?token=") for line in info), info


def test_command_keeps_the_working_directory_it_was_given():
    assert docker("run", "--rm", "-w", "/tmp", IMAGE, "pwd").stdout.strip() == "/tmp"


def test_notebooks_are_seeded_once_and_never_overwritten(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.chown(workspace, 1000, 100)
    docker("run", "--rm", "-v", f"{workspace}:/workspace", IMAGE, "true")
    seeded = sorted(p.name for p in (workspace / "notebooks").iterdir())
    assert seeded == sorted(os.listdir(ROOT / "notebooks"))
    mine = workspace / "notebooks" / seeded[0]
    mine.write_text("my edits")
    docker("run", "--rm", "-v", f"{workspace}:/workspace", IMAGE, "true")
    assert mine.read_text() == "my edits"


def test_train_py_runs_in_the_login_directory(services, ssh_key):
    out = ssh(services, ssh_key[0], "pwd && python train.py --help").stdout
    assert out.startswith("/home/jovyan\n")
    assert "--data" in out


def test_the_torchlab_command_has_each_subcommand_with_help(services):
    listed = services.exec("torchlab", "--help", user="jovyan").stdout
    for command in repository.commands():  # the command table, read from torchlab/cli.py
        out = services.exec("torchlab", command, "--help", user="jovyan").stdout
        assert out.startswith(f"usage: torchlab {command} "), (command, out[:200])
        assert f"\n  {command} " in listed, command
    unknown = services.exec("torchlab", "nonsense", user="jovyan", check=False)
    assert unknown.returncode == 2 and unknown.stderr.startswith("torchlab: error: unknown command 'nonsense'")


def doctor_lines(container):
    return [line for line in start_log(container.logs(), "INFO") if line.startswith("doctor: ")]


def test_start_log_carries_the_doctors_report(containers):
    container = containers.run()
    wait_for(lambda: any("shared memory" in line for line in doctor_lines(container)), 120, "the doctor's report")
    summary = wait_for(lambda: [line for line in doctor_lines(container) if " ok, " in line], 120, "its summary")
    assert re.fullmatch(r"doctor: \d+ ok, \d+ warn, \d+ fail", summary[0]), summary  # not "doctor: doctor:"
    assert "--shm-size" not in container.logs()  # the default loader (decode threads) needs no /dev/shm
    quiet = containers.run(env={"DOCTOR_AT_START": "no"})
    assert not doctor_lines(quiet)
