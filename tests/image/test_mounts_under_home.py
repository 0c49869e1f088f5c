"""A start never moves, deletes or recursively chowns what is mounted below the home.

usermod --move-home copies a home that holds a mount point and then removes the original, and
the removal reaches through the mount (jupyter/docker-stacks tests the same case). Each test
mounts a folder with a file owned by a host user, starts the container with options that rename
or renumber the account, and checks the host's file and its owner afterwards.
"""

import os
import uuid

import pytest

from helpers.docker import IMAGE, docker

OWNER = (4242, 4343)  # a host user that is none of the image's
OPTIONS = {
    "rename": {"NB_USER": "user"},
    "rename+chown": {"NB_USER": "user", "CHOWN_HOME": "yes", "CHOWN_HOME_OPTS": "-R"},
    "renumber+chown": {"NB_UID": "1234", "NB_GID": "2345", "CHOWN_HOME": "yes", "CHOWN_HOME_OPTS": "-R"},
}


def start(env, mount, command=("ls", "-la", "/home")):
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    return docker("run", "--rm", *env_args, "-v", mount, IMAGE, *command)


@pytest.fixture
def host_folder(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "foo.txt").write_text("precious")
    os.chown(folder / "foo.txt", *OWNER)
    os.chown(folder, *OWNER)
    return folder


def owner_and_text(path):
    stat = path.stat()
    return (stat.st_uid, stat.st_gid), path.read_text()


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("mode", ["rw", "ro"])
def test_bind_mount_below_the_home_is_left_as_it_was(host_folder, options, mode):
    result = start(options, f"{host_folder}:/home/jovyan/data:{mode}")
    assert owner_and_text(host_folder / "foo.txt") == (OWNER, "precious"), result.stderr
    assert (host_folder.stat().st_uid, host_folder.stat().st_gid) == OWNER
    assert sorted(os.listdir(host_folder)) == ["foo.txt"]


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_named_volume_below_the_home_is_left_as_it_was(options):
    volume = "torchlab-test-home-data-" + uuid.uuid4().hex[:8]
    uid, gid = OWNER
    try:
        shell = ["run", "--rm", "--entrypoint", "sh", "-v", f"{volume}:/v", IMAGE, "-c"]
        docker(*shell, f"echo precious > /v/foo.txt && chown -R {uid}:{gid} /v")
        start(options, f"{volume}:/home/jovyan/data")
        out = docker(*shell, "stat -c '%u:%g' /v /v/foo.txt && cat /v/foo.txt").stdout.split()
        assert out == [f"{uid}:{gid}", f"{uid}:{gid}", "precious"]
    finally:
        docker("volume", "rm", "-f", volume, check=False)


def test_renamed_user_keeps_a_home_that_holds_a_mount(host_folder):
    result = start(
        {"NB_USER": "user"},
        f"{host_folder}:/home/jovyan/data",
        command=("sh", "-c", "id -un; echo $HOME; cat /home/user/data/foo.txt"),
    )
    assert result.stdout.split() == ["user", "/home/jovyan", "precious"]
    assert "the home stays /home/jovyan (it holds mounts), /home/user links to it" in result.stderr


def test_without_mounts_the_home_moves_with_the_name():
    script = "echo $HOME; stat -c '%U %G' /home/nayvoj; test -e /home/jovyan || echo gone"
    out = docker("run", "--rm", "-e", "NB_USER=nayvoj", "-e", "CHOWN_HOME=yes", IMAGE, "sh", "-c", script).stdout
    assert out.split("\n")[:3] == ["/home/nayvoj", "nayvoj users", "gone"]
