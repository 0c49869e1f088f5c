"""The trust boundary (image/start/boundary.sh): whoever gets in as the user never becomes root. Each attack is
made as the user would make it, over SSH with the user's key, in every start mode it applies to (a root
start, and the --user starts 1000:100, 1010:0 and 1010:100); then root's own ways through the container
run (a restart, the healthcheck, `docker exec`), and nothing the user planted may run as root.

The payloads record the UID they ran as in /tmp/torchlab-evidence; each test also checks that a payload
does fire when the user runs it, so that a broken payload cannot pass for a safe image."""

import io
import os
import shlex
import subprocess
import tarfile

import pytest

from helpers.docker import DOCKER, IMAGE, SECRETS_IN_ENV, docker, start_log, wait_for
from helpers.jupyter import TOKEN, http_status
from helpers.ssh import ssh

AUTH = {"Authorization": f"token {TOKEN}"}

MODES = ["root", "1000:100", "1010:0", "1010:100"]
USER_MODES = MODES[1:]
EVIDENCE = "/tmp/torchlab-evidence"
# Commands the start-up, the healthcheck and an admin's `docker exec` run: planted under these names.
COMMANDS = (
    "stat id getent chown find setpriv awk ps python python3 env sh bash cat ls grep mkdir install rm ss sed "
    "tini sshd ssh-keygen od tr"
).split()
# A planted command: records who ran it, then runs the real one, so that the container keeps working.
FAKE_COMMAND = f"""#!/bin/sh
/usr/bin/mkdir -p -m 1777 {EVIDENCE} 2>/dev/null
/usr/bin/id -u >>{EVIDENCE}/command-"${{0##*/}}"
for dir in /opt/env/bin /usr/sbin /usr/bin /sbin /bin; do
    [ -x "$dir/${{0##*/}}" ] && exec "$dir/${{0##*/}}" "$@"
done
"""
PTH_LINE = (
    f"import os; os.makedirs('{EVIDENCE}', exist_ok=True); "
    f"open('{EVIDENCE}/pth-%d' % os.getpid(), 'w').write('%d\\n' % os.getuid())\n"
)
SHELL_LINE = f"\n/usr/bin/mkdir -p {EVIDENCE} 2>/dev/null; /usr/bin/id -u >>{EVIDENCE}/sourced\n"
# The reported hang: a program of the start's names that records its run, then never returns.
HANGING_PROGRAM = f"""#!/bin/sh
/usr/bin/mkdir -p -m 1777 {EVIDENCE} 2>/dev/null
/usr/bin/id -u >>{EVIDENCE}/hung-"${{0##*/}}"
exec /usr/bin/sleep infinity
"""
HANGING_PTH = f"import os, time; {PTH_LINE.strip()}; time.sleep(86400)\n"
# The start's own names, and what Jupyter's server runs by name as it starts (jupyterlab-git's GitPython runs
# `git version`, Python's platform module `uname -p`).
HANGING_NAMES = "sh test env bash ln cp id python torchlab jupyter git uname".split()
# What an admin types, as root: each must run nothing of the user's.
ROOT_EXECS = [
    ["ps"],
    ["id"],
    ["bash", "-lc", "true"],
    ["bash", "-c", "true"],
    ["sh", "-c", "true"],
    ["env", "SSH_CLIENT=1 2 3", "SSH_CONNECTION=1 2 3 4", "bash", "-c", "true"],
    ["python", "-c", "import json"],
    ["torchlab-healthcheck"],
]


def start(containers, mode, ssh_key, tmp_path, env=None, args=(), allowed_log=None):
    """A container in start mode `mode`, with the test key, probed by its healthcheck every second."""
    docker_args = [*args] if "--no-healthcheck" in args else ["--health-interval=1s", *args]
    if mode != "root":
        docker_args += ["--user", mode]
    if mode == "1010:0":  # OpenShift's kind of UID, with a folder of its own (docs/configuration.md)
        workspace = tmp_path / "ws"
        workspace.mkdir()
        os.chown(workspace, 1010, 0)
        docker_args += ["-v", f"{workspace}:/workspace"]
    env = {"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1], **(env or {})}
    return containers.run(*docker_args, env=env, allowed_log=allowed_log)


def as_user(container, ssh_key, script):
    return ssh(container, ssh_key[0], f"bash -c {shlex.quote(script)}", timeout=120).stdout


def evidence(container):
    """{file: [UIDs]} of what the payloads recorded."""
    listing = container.exec("sh", "-c", f"grep -r . {EVIDENCE} || true").stdout
    found = {}
    for line in listing.splitlines():
        path, uid = line.rsplit(":", 1)
        found.setdefault(path.rsplit("/", 1)[1], []).append(uid)
    return found


def ran_as_root(container):
    return {name: uids for name, uids in evidence(container).items() if "0" in uids}


def wait_health_checks(container, count=2):
    """Until the healthcheck has run `count` more times."""
    seen = {entry["Start"] for entry in container.state()["Health"]["Log"]}
    wait_for(
        lambda: len({e["Start"] for e in container.state()["Health"]["Log"]} - seen) >= count,
        30,
        "the healthcheck to run",
        container.logs,
    )


def restart(container, mode):
    """docker restart, as compose's restart policy or a host reboot would, then root's ways in."""
    docker("restart", "-t", "10", container.name, timeout=60)
    container.wait_ready()
    root_ways_in(container)


def root_ways_in(container):
    wait_health_checks(container)
    for command in ROOT_EXECS:
        container.exec(*command, user="0", check=False)


def plant_commands(container, ssh_key, folders):
    script = f"fake={shlex.quote(FAKE_COMMAND)}\n"
    script += f"for dir in {' '.join(folders)}; do mkdir -p \"$dir\" && for name in {' '.join(COMMANDS)}; do "
    script += 'printf "%s" "$fake" >"$dir/$name" && chmod 755 "$dir/$name"; done; done 2>/dev/null; true'
    as_user(container, ssh_key, script)


@pytest.mark.parametrize("mode", ["root"])
def test_the_healthcheck_and_root_python_load_no_user_site(containers, ssh_key, tmp_path, mode):
    # Finding 1: root's Python (the healthcheck every 3 s, the token's python -c) read the user's .pth files.
    container = start(containers, mode, ssh_key, tmp_path)
    site = as_user(container, ssh_key, "python -c 'import site; print(site.getusersitepackages())'").strip()
    assert site.startswith("/workspace/.local/")  # the user's own installs do land on the volume
    as_user(container, ssh_key, f"mkdir -p {site} && printf %s {shlex.quote(PTH_LINE)} >{site}/zz-evil.pth")
    as_user(container, ssh_key, "python -c 1")
    assert evidence(container), "the planted .pth did not run even for the user"
    root_ways_in(container)
    restart(container, mode)
    assert not ran_as_root(container)


@pytest.mark.parametrize("mode", MODES)
def test_commands_planted_on_the_users_path_never_run_as_root(containers, ssh_key, tmp_path, mode):
    # Finding 2: /workspace/.local/bin came before the system folders on root's PATH too.
    container = start(containers, mode, ssh_key, tmp_path)
    writable = as_user(
        container,
        ssh_key,
        """
        for dir in $(echo "$PATH" | tr : " "); do mkdir -p "$dir" 2>/dev/null && test -w "$dir" && echo "$dir"; done
        true""",
    ).split()
    assert "/workspace/.local/bin" in writable
    plant_commands(container, ssh_key, writable)
    as_user(container, ssh_key, "/workspace/.local/bin/id -u >/dev/null")  # last on the user's PATH: by its path
    assert evidence(container), "the planted commands did not run even for the user"
    root_ways_in(container)
    if mode == "root":
        restart(container, mode)
    assert not ran_as_root(container), ran_as_root(container)
    assert "/workspace" not in container.exec("printenv", "PATH").stdout


@pytest.mark.parametrize("opts", ["-R", ""], ids=["recursive", "plain"])
def test_chown_extra_refuses_a_link_the_user_planted(containers, ssh_key, tmp_path, opts):
    # Finding 3: with the named folder swapped for a link, a restart gave root's start scripts to the user.
    target = "/usr/local/lib/torchlab/start" if opts else "/usr/local/bin/entrypoint.sh"
    workspace = tmp_path / "ws"
    (workspace / "shared").mkdir(parents=True)
    os.chown(workspace, 1000, 100)
    env = {"CHOWN_EXTRA": "/workspace/shared", "CHOWN_EXTRA_OPTS": opts}
    refused = {"CHOWN_EXTRA: /workspace/shared is a symbolic link": "the user planted the link; the start refuses it"}
    args = ("-v", f"{workspace}:/workspace")
    container = start(containers, "root", ssh_key, tmp_path, env=env, args=args, allowed_log=refused)
    assert (workspace / "shared").stat().st_uid == 1000  # chowned at the first start, as asked
    as_user(container, ssh_key, f"rm -rf /workspace/shared && ln -s {target} /workspace/shared")
    docker("restart", "-t", "10", container.name, timeout=60)
    assert container.wait_exited(timeout=60) == 2
    errors = start_log(container.logs(), "ERROR")
    assert errors and "CHOWN_EXTRA: /workspace/shared is a symbolic link" in errors[-1], container.logs()
    assert [member.uid for member in copied_out(container, target)] == [0] * len(copied_out(container, target))


def copied_out(container, path):
    """The tar members of `path` copied out of a (stopped) container: their owners as stored."""
    tar = subprocess.run([DOCKER, "cp", f"{container.name}:{path}", "-"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        return archive.getmembers()


@pytest.mark.parametrize("mode", MODES)
def test_passwd_stays_read_only_and_sudo_obeys_no_entry_the_user_makes(containers, ssh_key, tmp_path, mode):
    # Finding 4: a writable /etc/passwd let the user name itself root, and sudoers' `root ALL` then matched.
    container = start(containers, mode, ssh_key, tmp_path)
    uid = mode.split(":")[0] if mode != "root" else "1000"
    probe = f"""
        test -w /etc/passwd && echo passwd-writable
        printf 'root:x:{uid}:100::/tmp:/bin/bash\\n' >>/etc/passwd 2>/dev/null && echo passwd-appended
        if [ -n "$NSS_WRAPPER_PASSWD" ]; then sed -i '1i root:x:{uid}:0::/tmp:/bin/bash' "$NSS_WRAPPER_PASSWD"; fi
        id -un; echo pw | sudo -S -u '#0' id -u 2>&1; sudo -n true 2>&1; true"""
    out = as_user(container, ssh_key, probe)
    assert "passwd-writable" not in out and "passwd-appended" not in out
    assert "uid=0" not in out and "\n0\n" not in f"\n{out}"
    sudoers = container.exec("sh", "-c", "grep -rhv '^#' /etc/sudoers /etc/sudoers.d | grep ALL || true").stdout
    assert sudoers.strip() == "", sudoers


@pytest.mark.parametrize("mode", MODES)
def test_root_shells_never_read_the_session_environment(containers, ssh_key, tmp_path, mode):
    # Finding 5: in a start without root the user owns session-env.sh, which root's login shells sourced.
    container = start(containers, mode, ssh_key, tmp_path)
    append = f"printf %s {shlex.quote(SHELL_LINE)} >>/run/torchlab/session-env.sh && echo w; true"
    out = as_user(container, ssh_key, append)
    assert (out.strip() == "w") == (mode != "root")  # a root start's file is root's
    as_user(container, ssh_key, ". /run/torchlab/session-env.sh 2>/dev/null; true")
    root_ways_in(container)
    assert not ran_as_root(container), ran_as_root(container)
    login_path = container.exec("bash", "-lc", "echo $PATH").stdout
    assert "/workspace" not in login_path


def test_jupyter_env_vars_to_unset_cannot_touch_the_entrypoints_own():
    # Finding 6: `as_user` in the list ran the command as root; PATH made bash look in /workspace.
    result = docker("run", "--rm", "-e", "JUPYTER_ENV_VARS_TO_UNSET=as_user,hub", IMAGE, "id", "-u")
    assert result.stdout.strip() == "1000"
    refused = docker("run", "--rm", "-e", "JUPYTER_ENV_VARS_TO_UNSET=PATH", IMAGE, "id", "-u", check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "JUPYTER_ENV_VARS_TO_UNSET names PATH" in start_log(refused.stderr, "ERROR")[0]


SECRETS = {"JUPYTER_PASSWORD": "pw-0e1f2a3b4c", "HF_TOKEN": "hf-5d6e7f8091", "WANDB_API_KEY": "wb-a2b3c4d5e6"}


@pytest.mark.parametrize("mode", MODES)
def test_no_secret_is_readable_by_the_user(containers, ssh_key, tmp_path, mode):
    # Finding 7: /proc/1/environ held JUPYTER_PASSWORD and what JUPYTER_ENV_VARS_TO_UNSET names.
    env = {**SECRETS, "JUPYTER_ENV_VARS_TO_UNSET": "HF_TOKEN,WANDB_API_KEY", "JUPYTER_TOKEN": ""}
    # Docker runs the healthcheck (as `docker exec`) with the container's configured environment, and as
    # the user in a start without root: the start warns of that below; here the probe is left out.
    container = start(
        containers, mode, ssh_key, tmp_path, env=env, args=("--no-healthcheck",), allowed_log=SECRETS_IN_ENV
    )
    # In every mode, as an admin's `docker exec -u jovyan` hands the container's environment to the user.
    warnings = [line for line in start_log(container.logs(), "WARNING") if "docker exec" in line]
    assert len(warnings) == 1 and "JUPYTER_PASSWORD HF_TOKEN WANDB_API_KEY" in warnings[0], container.logs()
    assert "JUPYTER_PASSWORD_FILE" in warnings[0] and ("runuser -l jovyan" in warnings[0]) == (mode == "root")
    key_body = ssh_key[1].split()[1]
    dump = as_user(
        container,
        ssh_key,
        """
        for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' <"$f"; echo; done 2>/dev/null
        find /run /tmp /home /workspace /etc /dev/shm -xdev -type f -readable -size -1M -exec cat {} + 2>/dev/null
        true""",
    )
    assert "entrypoint.sh" in dump  # /proc/1/cmdline: the dump did read the processes
    for name, value in SECRETS.items():
        assert value not in dump, f"{name} is readable by the user"
    # The key may be in authorized_keys (a public key), but in no process's environment.
    environs = as_user(container, ssh_key, "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; true")
    assert key_body not in environs and "SSH_PUBLIC_KEY" not in environs


def test_the_documented_exec_as_the_user_hands_over_no_secret(containers, ssh_key, tmp_path):
    # An admin's `docker exec -u jovyan` gives the user the operator's -e secrets (Docker passes the container's
    # environment to every exec); docs/security.md recommends `runuser -l`, which starts the user's side without it.
    env = {**SECRETS, "JUPYTER_ENV_VARS_TO_UNSET": "HF_TOKEN,WANDB_API_KEY", "JUPYTER_TOKEN": ""}
    container = start(
        containers, "root", ssh_key, tmp_path, env=env, args=("--no-healthcheck",), allowed_log=SECRETS_IN_ENV
    )
    plain = container.exec("sh", "-c", "tr '\\0' '\\n' </proc/self/environ", user="jovyan").stdout
    assert SECRETS["JUPYTER_PASSWORD"] in plain  # what the warning is about
    probe = "id -u; pwd; tr '\\0' '\\n' </proc/self/environ; python -c 'import site; print(site.getusersitepackages())'"
    out = container.exec("runuser", "-l", "jovyan", "-c", probe).stdout
    assert out.split()[:2] == ["1000", "/home/jovyan"] and "/workspace/.local/lib/" in out, out
    # A session of that form, running, as a watcher loop of the user's sees it.
    docker("exec", "-d", container.name, "runuser", "-l", "jovyan", "-c", "exec sleep 60")
    wait_for(lambda: container.exec("pgrep", "-u", "jovyan", "-x", "sleep", check=False).stdout, 30, "the session")
    dump = as_user(container, ssh_key, "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; true")
    assert "PYTHONUSERBASE=/workspace/.local" in dump  # the watcher did read the user's processes
    for name, value in SECRETS.items():
        assert value not in out and value not in dump, f"{name} reached the user"


@pytest.mark.parametrize("mode", USER_MODES)
def test_a_given_token_is_in_no_environment_but_jupyters(containers, ssh_key, tmp_path, mode):
    # Jupyter reads its token from its environment; PID 1 and the entrypoint hold it no more (the probe is
    # left out, as in the test above).
    container = start(containers, mode, ssh_key, tmp_path, args=("--no-healthcheck",))
    holders = (
        as_user(
            container,
            ssh_key,
            f"""
        for f in /proc/[0-9]*/environ; do
            grep -q {TOKEN} "$f" 2>/dev/null && tr '\\0' ' ' <"${{f%/environ}}/cmdline" && echo
        done; true""",
        )
        .strip()
        .splitlines()
    )
    assert holders and all("jupyter" in command for command in holders), holders


@pytest.mark.parametrize("mode", MODES)
def test_nothing_the_user_can_write_runs_as_root(containers, ssh_key, tmp_path, mode):
    # The general case: a payload in every folder the user can write (commands of the start-up's names,
    # sitecustomize, usercustomize and .pth files, and json.py, which `python -c 'import json'` imports from
    # the current folder), appended to every shell and Python file it can write;
    # then a restart (root starts), the healthcheck and an admin's docker exec as root.
    container = start(containers, mode, ssh_key, tmp_path)
    folders = as_user(
        container,
        ssh_key,
        r"""
        find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type d -writable -print 2>/dev/null
        echo "$HOME/.local/bin"; python -c 'import site; print(site.getusersitepackages())'""",
    ).split()
    assert "/workspace" in folders
    plant_commands(container, ssh_key, folders)
    python_payload = shlex.quote(PTH_LINE)
    shell_line = shlex.quote(SHELL_LINE)
    as_user(
        container,
        ssh_key,
        f"""
        for dir in {' '.join(folders)}; do
            for f in sitecustomize.py usercustomize.py zz-evil.pth json.py; do
                printf %s {python_payload} >"$dir/$f"
            done
        done 2>/dev/null
        find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type f -writable \\
            \\( -name '*.sh' -o -name '*rc' -o -name '*profile' \\) -print 2>/dev/null |
            while read -r f; do printf %s {shell_line} >>"$f"; done
        true""",
    )
    as_user(container, ssh_key, "python -c 1; bash -lc true; cd /workspace && python -c 'import json'")
    assert evidence(container), "no payload ran even for the user"
    root_ways_in(container)
    if mode == "root":
        restart(container, mode)
    assert not ran_as_root(container), ran_as_root(container)


@pytest.mark.parametrize("mode", MODES[:3])
def test_a_restart_runs_nothing_the_user_planted(containers, ssh_key, tmp_path, mode):
    # Round two: a `sh` on the user's PATH that hangs left every restart at "health: starting", with no way in.
    # The start may run no program of the user's before the services are up, as root or as the user.
    container = start(containers, mode, ssh_key, tmp_path)
    site = as_user(container, ssh_key, "python -c 'import site; print(site.getusersitepackages())'").strip()
    home = as_user(container, ssh_key, 'echo "$HOME"').strip()
    program = shlex.quote(HANGING_PROGRAM)
    as_user(
        container,
        ssh_key,
        f"""
        for dir in /workspace/.local/bin "$HOME/bin"; do
            mkdir -p "$dir" && for name in {" ".join(HANGING_NAMES)}; do
                printf %s {program} >"$dir/$name" && chmod 755 "$dir/$name"
            done
        done
        mkdir -p {site} && printf %s {shlex.quote(HANGING_PTH)} >{site}/zz-hang.pth""",
    )
    docker("restart", "-t", "10", container.name, timeout=60)
    container.wait_ready()
    wait_for(lambda: container.state()["Health"]["Status"] == "healthy", 60, "a healthy container", container.logs)
    assert not evidence(container), f"planted programs ran at the start: {evidence(container)}"
    # The planted files are live: the user's own processes do run them.
    user = "1000" if mode == "root" else mode.split(":")[0]
    for program in (f"{home}/bin/id", "/workspace/.local/bin/sh"):
        container.exec("/usr/bin/timeout", "5", program, user=user, check=False)
    container.exec(
        "/usr/bin/timeout",
        "5",
        "env",
        f"PYTHONUSERBASE={site.split('/lib/')[0]}",
        "python",
        "-c",
        "1",
        user=user,
        check=False,
    )
    assert set(evidence(container)) >= {"hung-id", "hung-sh"} and any(
        name.startswith("pth-") for name in evidence(container)
    ), evidence(container)


def test_a_restart_as_the_user_gets_past_what_the_user_left_in_its_files(containers, ssh_key, tmp_path):
    # In a start as the user, /run/torchlab and the host keys in the home are the user's: a FIFO where the start
    # writes a file hung it, a folder where it removes one stopped it, a bad host key made sshd exit.
    container = start(containers, "1010:0", ssh_key, tmp_path)
    as_user(
        container,
        ssh_key,
        """
        cd /run/torchlab && rm -f services && mkdir services && mkfifo session-env.sh.tmp
        rm -rf jupyter && echo junk >jupyter
        for key in "$HOME"/.ssh/host_keys/ssh_host_*_key; do echo garbage >"$key"; done
        ls "$HOME"/.ssh/host_keys/ssh_host_ed25519_key""",
    )
    docker("restart", "-t", "10", container.name, timeout=60)
    container.wait_ready()
    wait_for(lambda: container.state()["Health"]["Status"] == "healthy", 60, "a healthy container", container.logs)
    assert "ssh_host_ed25519_key was no usable key; making a new one" in container.logs()


@pytest.mark.parametrize("mode", MODES)
def test_a_folder_the_user_makes_unreadable_stops_no_later_start(containers, ssh_key, tmp_path, mode):
    # Issue 44: chmod 000 on a folder of theirs under /run/torchlab, or on /workspace, made the next start exit 1.
    shut_out = {r"^/workspace \(d-.* cannot be entered by UID": "the user made /workspace unreadable on purpose"}
    container = start(containers, mode, ssh_key, tmp_path, allowed_log=shut_out)
    script = "for d in /run/torchlab/*/ /workspace; do [ -O ${d%/} ] && chmod 000 ${d%/} && echo ${d%/}; done; true"
    made = as_user(container, ssh_key, script).split()
    assert any(path.startswith("/run/torchlab/") for path in made), made  # the runtime folder, in every mode
    assert ("/workspace" in made) == (mode != "1010:100"), made  # 1010:100 does not own the image's /workspace
    warnings_before = len(start_log(container.logs(), "WARNING"))

    docker("restart", "-t", "10", container.name, timeout=60)
    container.wait_ready()  # sshd and Jupyter, both up

    warnings = start_log(container.logs(), "WARNING")[warnings_before:]
    work_dir = as_user(container, ssh_key, "echo $TORCHLAB_WORK_DIR; touch $TORCHLAB_WORK_DIR/saved && echo saved")
    contents = http_status(f"http://127.0.0.1:{container.host_port(8888)}/api/contents", AUTH)
    assert contents == 200 and work_dir.split()[1] == "saved", work_dir
    if "/workspace" not in made:
        assert warnings == [] and work_dir.split()[0] == "/workspace", container.logs()
        return
    assert len(warnings) == 1, container.logs()
    assert warnings[0].startswith("/workspace (d--") and " cannot be entered by UID " in warnings[0], warnings[0]
    assert f"go to {work_dir.split()[0]} for this start; give it back" in warnings[0], warnings[0]
    assert "chmod u+rwx /workspace" in warnings[0]
    mode_left = container.exec("stat", "-c", "%A", "/workspace").stdout.strip()
    assert not set("rwx") & set(mode_left), mode_left  # left as the user made it (chmod 000 keeps a setgid bit)
