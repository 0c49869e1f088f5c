"""train.py the way users run it: over a real SSH session with nohup, logged out, and stopped
by `docker stop` in the middle of a run."""

import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from helpers.docker import DOCKER, IMAGE, docker, wait_for
from helpers.jupyter import TOKEN, http_status
from helpers.ssh import ssh

pytestmark = pytest.mark.slow

# Small and quick on 2 CPU cores; the flags are the user's, only the sizes are shrunk.
SAMPLE_DATA = "torchlab sample-data /workspace/sample-data"
TRAIN_FLAGS = (
    "--data /workspace/sample-data --arch resnet18 --image-size 48 --batch-size 16 --workers 2 --log-interval 5"
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trainer(module_containers, ssh_key):
    container = module_containers.run(env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}, shm_size="1g")
    ssh(container, ssh_key[0], SAMPLE_DATA, timeout=300)
    return container


def user_processes(container, pattern):
    return container.exec("pgrep", "-u", "jovyan", "-f", pattern, check=False).stdout.split()


def records(container, run_dir):
    text = container.exec("cat", f"/home/jovyan/{run_dir}/metrics.jsonl").stdout
    return [json.loads(line) for line in text.splitlines()]


def test_nohup_run_survives_logout_and_writes_checkpoints(trainer, ssh_key):
    ssh(trainer, ssh_key[0], f"nohup python train.py {TRAIN_FLAGS} --epochs 2 --run-dir runs/nohup > log.txt 2>&1 &")
    # The SSH session has ended (logged out); the run goes on without it.
    wait_for(
        lambda: not user_processes(trainer, "train.py .*runs/nohup"),
        600,
        "the nohup run to finish",
        lambda: trainer.exec("tail", "-5", "/home/jovyan/log.txt", check=False).stdout,
    )
    log = trainer.exec("cat", "/home/jovyan/log.txt").stdout
    assert "finished --epochs 2" in log, log
    assert "Traceback" not in log
    files = trainer.exec("ls", "/home/jovyan/runs/nohup").stdout.split()
    assert "config.json" in files
    assert any(name.startswith("checkpoint-") and name.endswith(".pt") for name in files)
    assert [r["epoch"] for r in records(trainer, "runs/nohup") if r["kind"] == "epoch"] == [0, 1]


def readme_nohup_line():
    """The README's own nohup line, as a user copies it."""
    (line,) = re.findall(r"`(nohup python train\.py --data /data [^`]*)`", (ROOT / "README.md").read_text())
    return line


def test_the_readmes_nohup_line_returns_at_once_and_its_log_outlives_the_container(containers, ssh_key):
    # Issue 44: sent as one ssh command, `> log.txt &` kept ssh open until training ended (stderr was the
    # channel), and log.txt sat in the home, which a re-created container loses.
    volume = "torchlab-test-readme-" + uuid.uuid4().hex[:8]
    env = {"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}
    line = readme_nohup_line().replace("--data /data", f"{TRAIN_FLAGS} --epochs 50 --run-dir /workspace/runs/readme")
    log_file = re.search(r"> (\S+)", line).group(1)
    assert log_file.startswith("/workspace/"), line
    try:
        first = containers.run("-v", f"{volume}:/workspace", env=env, shm_size="1g")
        ssh(first, ssh_key[0], SAMPLE_DATA, timeout=300)
        ssh(first, ssh_key[0], line, timeout=30)  # a run of 50 epochs: returning at all is returning at once
        assert user_processes(first, "train.py .*runs/readme"), "the run did not outlive the ssh command"
        wait_for(
            lambda: "images/s" in first.exec("cat", log_file, check=False).stdout,
            300,
            "the run's first progress line",
            lambda: first.exec("tail", "-5", log_file, check=False).stdout,
        )
        docker("stop", "-t", "60", first.name, timeout=90)
        docker("rm", "-f", first.name)

        second = containers.run("-v", f"{volume}:/workspace", env=env, shm_size="1g")
        log = second.exec("cat", log_file).stdout
        assert "images/s" in log and "stopped by SIGTERM" in log, log
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)


def test_docker_stop_lets_a_run_started_over_ssh_checkpoint(containers, ssh_key, tmp_path):
    container = containers.run(env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}, shm_size="1g")
    ssh(container, ssh_key[0], SAMPLE_DATA, timeout=300)
    ssh(container, ssh_key[0], f"nohup python train.py {TRAIN_FLAGS} --epochs 50 --run-dir runs/long > log.txt 2>&1 &")
    wait_for(
        lambda: container.exec("grep", "-q", "images/s", "/home/jovyan/log.txt", check=False).returncode == 0,
        300,
        "the run's first progress line",
    )
    docker("stop", "-t", "60", container.name, timeout=90)
    assert container.state()["ExitCode"] == 0
    # The stopped container's files are still there to read.
    docker("cp", f"{container.name}:/home/jovyan/", str(tmp_path / "home"))
    log = (tmp_path / "home/log.txt").read_text()
    assert "stopped by SIGTERM" in log, log
    assert list((tmp_path / "home/runs/long").glob("checkpoint-*.pt"))


def checkpoint_steps(container, run_dir):
    names = container.exec("ls", run_dir, check=False).stdout.split()
    return sorted(int(match.group(1)) for name in names if (match := re.fullmatch(r"checkpoint-(\d+)\.pt", name)))


def test_make_stop_lets_a_run_save_a_checkpoint_newer_than_its_last_periodic_one(containers, ssh_key):
    """make stop, as users stop `make run`'s container: train.py gets SIGTERM and the time to checkpoint
    before the container is removed. One epoch of 80 steps, with a checkpoint every 1.2 s within it: the
    stop lands inside the epoch, so its checkpoint is the stop's own."""
    volume = "torchlab-test-stop-" + uuid.uuid4().hex[:8]
    run_dir = "/workspace/runs/stop"
    flags = (
        "--data /workspace/sample-data --arch resnet50 --image-size 64 --batch-size 2 --workers 2 --epochs 1 "
        f"--checkpoint-minutes 0.02 --log-interval 5 --run-dir {run_dir}"
    )
    try:
        container = containers.run("-v", f"{volume}:/workspace", env={"SSH_PUBLIC_KEY": ssh_key[1]}, shm_size="1g")
        ssh(container, ssh_key[0], SAMPLE_DATA, timeout=300)
        ssh(container, ssh_key[0], f"nohup python train.py {flags} > /workspace/stop.log 2>&1 &")
        wait_for(
            lambda: checkpoint_steps(container, run_dir),
            300,
            "the run's first periodic checkpoint",
            lambda: container.exec("tail", "-5", "/workspace/stop.log", check=False).stdout,
        )
        periodic = checkpoint_steps(container, run_dir)[-1]
        make_stop = ["make", "-s", "stop", f"CONTAINER={container.name}", f"IMAGE={IMAGE}", f"DOCKER={DOCKER}"]
        stop = subprocess.run(make_stop, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
        assert stop.returncode == 0, stop.stderr
        assert docker("inspect", container.name, check=False).returncode != 0, "make stop left the container"
        log = docker("run", "--rm", "-v", f"{volume}:/workspace", "--entrypoint", "cat", IMAGE, "/workspace/stop.log")
        saved = re.search(
            rf"stopped by SIGTERM at epoch 0, step (\d+): saved {run_dir}/checkpoint-(\d+)\.pt", log.stdout
        )
        assert saved, log.stdout
        assert int(saved.group(1)) == int(saved.group(2)) > periodic
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)


def test_default_run_resumes_after_the_container_is_recreated_on_the_volume(containers, ssh_key):
    volume = "torchlab-test-runs-" + uuid.uuid4().hex[:8]
    env = {"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}
    # The README's command, with the run dir left at its default.
    command = f"python train.py {TRAIN_FLAGS} --epochs 2 --resume auto"
    try:
        first = containers.run("-v", f"{volume}:/workspace", env=env, shm_size="1g")
        ssh(first, ssh_key[0], SAMPLE_DATA, timeout=300)
        out = ssh(first, ssh_key[0], command + " --max-steps 3", timeout=600).stdout
        assert "stopped by --max-steps 3" in out
        docker("rm", "-f", first.name)

        second = containers.run("-v", f"{volume}:/workspace", env=env, shm_size="1g")
        out = ssh(second, ssh_key[0], command, timeout=600).stdout
        assert "resumed from /workspace/runs/default/checkpoint-00000003.pt" in out, out
        assert "finished --epochs 2" in out
        # Jupyter, rooted at /workspace, shows the run.
        url = f"http://127.0.0.1:{second.host_port(8888)}/api/contents/runs/default"
        assert http_status(url, {"Authorization": f"token {TOKEN}"}) == 200
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)
