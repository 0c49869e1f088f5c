"""Idle cullers see a training run (issue 44): while train.py runs, started over SSH, jupyter_server's last_activity
advances (/api/status, which jupyterhub-singleuser reports to the hub) and /api/kernels counts as active under
Kubeflow's culler's rules (helpers.kubeflow, ported from its source); when the run ends the activity stops;
TRAINING_IS_ACTIVITY=no turns it off. Requests here carry no_track_activity, so they are no activity themselves."""

import datetime

from helpers.docker import wait_for
from helpers.jupyter import TOKEN, api
from helpers.kubeflow import culler_last_activity, culler_stops, parse_time
from helpers.ssh import ssh

SAMPLE_DATA = "torchlab sample-data /tmp/sample-data --classes 2"
RUN = (
    "nohup python train.py --data /tmp/sample-data --arch resnet18 --image-size 48 --batch-size 16 --epochs 50 "
    "--run-dir /tmp/run > /tmp/train.log 2>&1 < /dev/null &"
)


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def last_activity(container):
    return parse_time(api(container, "/api/status")["last_activity"])


def kernels(container):
    return api(container, "/api/kernels?no_track_activity=1")


def start_run(container, ssh_key):
    ssh(container, ssh_key[0], SAMPLE_DATA, timeout=120)
    started = now()
    ssh(container, ssh_key[0], RUN)

    def read_log():
        return container.exec("cat", "/tmp/train.log", check=False).stdout

    wait_for(lambda: "images/s" in read_log(), 180, "the run's first progress line", read_log)
    return started


def test_a_training_run_is_activity_that_cullers_see_until_it_ends(containers, ssh_key):
    container = containers.run(env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]})
    created = last_activity(container)
    assert kernels(container) == [] and culler_last_activity(kernels(container), created, now()) == created

    started = start_run(container, ssh_key)
    # jupyter_server's last_activity advances while it trains (every 10 s), and /api/kernels has a busy entry.
    wait_for(lambda: last_activity(container) > started, 30, "last_activity to advance past the run's start")
    (entry,) = kernels(container)
    assert entry["id"] == "torchlab-training" and entry["execution_state"] == "busy", entry
    checked = now()
    annotation = culler_last_activity(kernels(container), created, checked)
    assert annotation == checked and not culler_stops(annotation, checked, cull_idle_minutes=1)

    ssh(container, ssh_key[0], "pkill -TERM -f 'train.py --data'")
    wait_for(lambda: not container.exec("pgrep", "-f", "train.py --data", check=False).stdout, 120, "the run's end")
    ended = now()
    assert kernels(container) == []  # Kubeflow's culler: no kernels, last-activity stays where it was
    assert culler_last_activity(kernels(container), annotation, ended) == annotation
    assert culler_stops(annotation, annotation + datetime.timedelta(minutes=2), cull_idle_minutes=1)
    assert last_activity(container) <= ended  # the end is no activity


def test_training_is_activity_no_turns_it_off(containers, ssh_key):
    env = {"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1], "TRAINING_IS_ACTIVITY": "no"}
    container = containers.run(env=env)
    started = start_run(container, ssh_key)
    assert kernels(container) == [] and last_activity(container) < started
    assert "TORCHLAB_ACTIVITY_DIR" not in ssh(container, ssh_key[0], "env").stdout
