"""The rest of jupyter/docker-stacks' user contract: NB_GROUP, NB_GID with `users` kept,
CHOWN_EXTRA and CHOWN_EXTRA_OPTS, JUPYTER_ENV_VARS_TO_UNSET."""

import os

import pytest

from helpers.docker import IMAGE, docker, wait_for
from helpers.jupyter import TOKEN
from helpers.ssh import ssh

UNSET = {
    "JUPYTER_ENV_VARS_TO_UNSET": "SECRET_ANIMAL,UNUSED_ENV,SECRET_FRUIT",
    "FRUIT": "bananas",
    "SECRET_ANIMAL": "cats",
    "SECRET_FRUIT": "mango",
}
SAYS = 'echo "I like $FRUIT and ${SECRET_FRUIT:-stuff}, and love ${SECRET_ANIMAL:-to keep secrets}!"'


def run(env, *command, docker_args=()):
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    return docker("run", "--rm", *env_args, *docker_args, IMAGE, *command)


def test_nb_gid_gets_a_group_named_after_the_user_and_keeps_users():
    assert (
        run({"NB_GID": "110"}, "id").stdout.strip() == "uid=1000(jovyan) gid=110(jovyan) groups=110(jovyan),100(users)"
    )


def test_nb_group_names_the_new_primary_group():
    out = run({"NB_GROUP": "team", "NB_GID": "2000"}, "id").stdout.strip()
    assert out == "uid=1000(jovyan) gid=2000(team) groups=2000(team),100(users)"


def test_nb_group_alone_names_the_default_group():
    assert run({"NB_GROUP": "team"}, "id", "-gn").stdout.strip() == "team"


def test_nb_group_of_an_existing_group_takes_its_gid():
    assert run({"NB_GROUP": "users"}, "id").stdout.strip() == "uid=1000(jovyan) gid=100(users) groups=100(users)"


def test_nb_user_change_keeps_users_and_owns_the_home():
    out = run({"NB_USER": "nayvoj", "CHOWN_HOME": "yes"}, "sh", "-c", "id; stat -c '%U %G' /home/nayvoj/")
    assert out.stdout.splitlines() == ["uid=1000(nayvoj) gid=100(users) groups=100(users)", "nayvoj users"]


def test_chown_extra_recursive(tmp_path):
    env = {
        "NB_UID": "1010",
        "NB_GID": "101",
        "CHOWN_EXTRA": "/home/jovyan,/opt/torchlab/notebooks",
        "CHOWN_EXTRA_OPTS": "-R",
    }
    notebook = sorted(os.listdir(os.path.join(os.path.dirname(__file__), "../../notebooks")))[0]
    out = run(env, "stat", "-c", "%n:%u:%g", "/home/jovyan/.bashrc", f"/opt/torchlab/notebooks/{notebook}").stdout
    assert out.split() == ["/home/jovyan/.bashrc:1010:101", f"/opt/torchlab/notebooks/{notebook}:1010:101"]


def test_chown_extra_without_opts_is_not_recursive():
    out = run(
        {"NB_UID": "1010", "CHOWN_EXTRA": "/opt/torchlab"},
        "stat",
        "-c",
        "%u",
        "/opt/torchlab",
        "/opt/torchlab/notebooks",
    ).stdout.split()
    assert out == ["1010", "0"]


def test_chown_extra_stops_at_a_mount_it_did_not_name(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "keep.txt").write_text("host's")
    os.chown(data / "keep.txt", 4242, 4242)
    named = tmp_path / "named"
    named.mkdir()
    (named / "mine.txt").write_text("mine")
    mounts = ("-v", f"{data}:/opt/extra/data", "-v", f"{named}:/opt/named")
    out = run(
        {"CHOWN_EXTRA": "/opt/extra,/opt/named", "CHOWN_EXTRA_OPTS": "-R", "NB_UID": "1010"},
        "stat",
        "-c",
        "%u",
        "/opt/extra",
        docker_args=mounts,
    ).stdout.split()
    assert out == ["1010"]
    assert (data / "keep.txt").stat().st_uid == 4242  # below a named path, but a mount of its own
    assert (named / "mine.txt").stat().st_uid == 1010  # a mount named in CHOWN_EXTRA


@pytest.mark.parametrize("user", [(), ("--user", "1000:100")], ids=["root start", "user start"])
def test_jupyter_env_vars_to_unset_in_the_command(user):
    assert run(UNSET, "bash", "-c", SAYS, docker_args=user).stdout.strip() == (
        "I like bananas and stuff, and love to keep secrets!"
    )


def test_jupyter_env_vars_to_unset_reach_neither_jupyter_nor_ssh(containers, ssh_key):
    container = containers.run(env={**UNSET, "JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]})
    pid = wait_for(lambda: container.exec("pgrep", "-f", "jupyter-notebook", check=False).stdout.split(), 30, "Jupyter")
    environ = container.exec("cat", f"/proc/{pid[0]}/environ", user="jovyan").stdout.split("\0")
    assert "FRUIT=bananas" in environ
    assert not [entry for entry in environ if entry.startswith(("SECRET_ANIMAL=", "SECRET_FRUIT="))]
    assert ssh(container, ssh_key[0], SAYS).stdout.strip() == "I like bananas and stuff, and love to keep secrets!"
