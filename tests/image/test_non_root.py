"""Starts without root: `docker run --user` as Kubernetes runAsNonRoot, OpenShift's arbitrary UIDs
(GID 0) and rootless Podman start the image. Jupyter and sshd run as that UID."""

import os
import uuid

import pytest

from helpers.docker import IMAGE, docker, start_log
from helpers.jupyter import TOKEN, http_status
from helpers.ssh import ssh

NO_HOME = {"can write neither its home": "a UID outside the group users with no folder of its own (the warning's case)"}
TORCH_IMPORTS = "python -c 'import torch; print(torch.__version__)'"


def processes(container):
    """(uid, command) of every process in the container."""
    rows = container.exec("ps", "-e", "-o", "uid=,args=").stdout.splitlines()
    return [
        (int(row.split(None, 1)[0]), row.split(None, 1)[1])
        for row in rows
        if not row.strip().endswith("ps -e -o uid=,args=")
    ]


def check_services(container, key, uid):
    port = container.host_port(8888)
    assert http_status(f"http://127.0.0.1:{port}/api/status", {"Authorization": f"token {TOKEN}"}) == 200
    assert http_status(f"http://127.0.0.1:{port}/api/status") == 403
    out = ssh(container, key, f"id -u; {TORCH_IMPORTS}").stdout.split()
    assert out[0] == str(uid) and out[1].startswith("2.")
    assert {owner for owner, _ in processes(container)} == {uid}, processes(container)
    assert any("sshd" in command for _, command in processes(container))
    docker("stop", "-t", "5", container.name, timeout=30)
    assert container.state()["ExitCode"] == 0


@pytest.mark.parametrize("gid", [0, 100], ids=["GID 0 (OpenShift)", "GID 100 (users)"])
def test_arbitrary_uid(containers, ssh_key, tmp_path, gid):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.chown(workspace, 1010, gid)
    container = containers.run(
        "--user",
        f"1010:{gid}",
        "-v",
        f"{workspace}:/workspace",
        env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]},
    )
    assert "UID 1010 had no passwd entry: it is now jovyan" in container.logs()
    who = ssh(container, ssh_key[0], "id -un; echo $HOME; git --version").stdout.split()
    assert who[:2] == ["jovyan", "/workspace"]
    assert (workspace / "notebooks").stat().st_uid == 1010
    check_services(container, ssh_key[0], 1010)


def test_image_uid_with_users_group_and_a_read_only_root(containers, ssh_key):
    volume = "torchlab-test-ro-" + uuid.uuid4().hex[:8]
    tmpfs = [
        "--tmpfs",
        "/run/torchlab:uid=1000,gid=100",
        "--tmpfs",
        "/tmp:mode=1777",
        "--tmpfs",
        "/home/jovyan:uid=1000,gid=100",
    ]
    try:
        container = containers.run(
            "--user",
            "1000:100",
            "--read-only",
            *tmpfs,
            "-v",
            f"{volume}:/workspace",
            env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]},
        )
        assert "host keys in /home/jovyan/.ssh/host_keys" in container.logs()
        check_services(container, ssh_key[0], 1000)
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)


def test_what_needs_root_is_skipped_one_line_each():
    env = {"GRANT_SUDO": "yes", "NB_UID": "1234", "CHOWN_HOME": "yes", "NB_GROUP": "team", "NB_USER": "kitten"}
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    skipped_on_purpose = {": skipped, ": "the test asks for what needs root in a start without it"}
    result = docker("run", "--rm", "--user", "1000:100", *env_args, IMAGE, "id", allowed_log=skipped_on_purpose)
    assert result.stdout.strip() == "uid=1000(jovyan) gid=100(users) groups=100(users)"
    skipped = start_log(result.stderr, "WARNING")
    assert [line.split(": skipped, ")[0] for line in skipped] == [
        "NB_USER=kitten",
        "NB_UID/NB_GID",
        "NB_GROUP",
        "GRANT_SUDO",
        "CHOWN_HOME/CHOWN_EXTRA",
    ]
    assert all("root start" in line for line in skipped)


def test_no_setuid_program_but_sudo():
    out = docker("run", "--rm", "--entrypoint", "find", IMAGE, "/", "-xdev", "-perm", "-4000", "-type", "f").stdout
    assert out.split() == ["/usr/bin/sudo"]


def test_a_uid_with_no_entry_gets_one_from_nss_wrapper_and_a_command_runs_without_one():
    # Any GID: the entry is nss_wrapper's, in /run/torchlab/nss; /etc/passwd stays as the image has it.
    run = ("run", "--rm", "--user", "1010:1010", IMAGE, "sh", "-c", "id; getent passwd 1010")
    out = docker(*run, allowed_log=NO_HOME).stdout
    assert out.splitlines()[0] == "uid=1010(jovyan) gid=1010(jovyan) groups=1010(jovyan)"
    assert out.splitlines()[1].startswith("jovyan:x:1010:1010:")
    # A read-only root with no tmpfs at /run/torchlab: nowhere for the entry, nor for sshd's files.
    services = docker("run", "--rm", "--read-only", "--user", "1010:1010", IMAGE, check=False, timeout=60)
    assert services.returncode == 2
    assert len(services.stderr.strip().splitlines()) == 1
    assert start_log(services.stderr, "ERROR")[0].startswith("/run/torchlab is not writable by UID 1010")


def test_a_uid_that_can_write_no_home_is_told_what_to_do_in_one_warning():
    result = docker("run", "--rm", "--user", "1010:0", IMAGE, "true", allowed_log=NO_HOME)
    warnings = start_log(result.stderr, "WARNING")
    assert len(warnings) == 1, result.stderr  # not a second one for the notebooks' copy
    assert "can write neither its home" in warnings[0] and "--group-add=users" in warnings[0]
    assert "cp:" not in result.stderr


def test_group_users_lets_any_uid_save_in_workspace():
    probe = "id -Gn; touch /workspace/mine && ls /workspace/notebooks | head -n1"
    result = docker("run", "--rm", "--user", "1010:0", "--group-add=users", IMAGE, "sh", "-c", probe)
    groups, notebook = result.stdout.split("\n")[:2]
    assert "users" in groups.split() and notebook.endswith(".ipynb"), result.stdout
    assert not start_log(result.stderr, "WARNING"), result.stderr


def test_sample_data_fills_an_existing_empty_mount(tmp_path):
    # `torchlab sample-data /out` into an empty mount of the user's failed, naming `/` (its parent) as unwritable.
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, 1000, 100)
    run = ["run", "--rm", "--user", "1000:100", "-v", f"{out}:/out", "--entrypoint", "torchlab", IMAGE]
    result = docker(*run, "sample-data", "/out", "--per-class", "2", "--val-per-class", "1", check=False)
    assert result.returncode == 0 and result.stdout.strip() == "wrote /out", result.stderr
    assert sorted(path.name for path in out.iterdir()) == [".sample-data.json", "train", "val"]
    assert len(list((out / "train").glob("*/*.JPEG"))) == 8
    again = docker(*run, "sample-data", "/out", check=False)
    assert again.stdout.strip() == "already complete: /out"
    empty = tmp_path / "read-only"
    empty.mkdir(mode=0o555)
    refused = docker(
        "run",
        "--rm",
        "--user",
        "1000:100",
        "-v",
        f"{empty}:/ro",
        "--entrypoint",
        "torchlab",
        IMAGE,
        "sample-data",
        "/ro",
        check=False,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip() == "torchlab sample-data: error: /ro: /ro is not a folder that UID 1000 can write in"
