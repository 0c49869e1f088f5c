"""A live training run's record for Jupyter's idle-culler activity (torchlab.activity): written while train.py runs,
gone when it ends; a record counts only while its process lives."""

import json
import os
import signal
import subprocess
import sys

from conftest import QUICK_RUN, TRAIN_ENV, train_command, wait_until
from torchlab import activity


def test_a_record_counts_while_its_process_lives(tmp_path, monkeypatch):
    folder = tmp_path / "activity"
    monkeypatch.setenv(activity.ACTIVITY_DIR_VARIABLE, str(folder))
    with activity.announced("runs/x"):
        (record,) = activity.live_runs(folder)
        assert record["pid"] == os.getpid() and record["run_dir"] == os.path.abspath("runs/x")
    assert activity.live_runs(folder) == [] and os.listdir(folder) == []

    # Killed with SIGKILL, a run leaves its record; a gone process, or its PID reused by another, counts for nothing.
    print_pid = [sys.executable, "-c", "import os; print(os.getpid())"]
    gone = subprocess.run(print_pid, capture_output=True, text=True, check=True)
    (folder / f"{gone.stdout.strip()}.json").write_text(json.dumps({"pid": int(gone.stdout), "start": "1"}))
    (folder / "1.json").write_text(json.dumps({"pid": os.getpid(), "start": "0"}))  # this PID, another start
    (folder / "2.json").write_text("not json")
    assert activity.live_runs(folder) == []


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(activity.ACTIVITY_DIR_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    with activity.announced("run"):
        assert os.listdir(tmp_path) == []


def test_train_py_is_a_live_run_until_it_ends(sample_set, tmp_path):
    folder = tmp_path / "activity"
    env = {**TRAIN_ENV, activity.ACTIVITY_DIR_VARIABLE: str(folder)}
    flags = ("--data", sample_set, "--run-dir", tmp_path / "run", "--epochs", "50", "--workers", "0", *QUICK_RUN)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    process = subprocess.Popen(train_command(*flags), env=env, **pipes)
    try:
        wait_until(lambda: activity.live_runs(folder), "the run's record", process=process)
        assert [record["pid"] for record in activity.live_runs(folder)] == [process.pid]
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0 and activity.live_runs(folder) == [] and os.listdir(folder) == []
