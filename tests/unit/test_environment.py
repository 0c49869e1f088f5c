"""The environment record (RUN_DIR/environment.json), `torchlab env diff` and `torchlab env export` (issue 27).

A changed package is what `pip install --user` leaves: a .dist-info folder in a place earlier on sys.path
(PYTHONPATH here), which importlib.metadata reads as it reads the image's. The module itself stays the image's.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from conftest import QUICK_RUN, ROOT, TRAIN_ENV, read_metrics, run_train, torchlab_command
from torchlab import environment, machine
from torchlab.pipeline import loader
from torchlab.tools import env as env_tool

ASKED_IN_FLIGHT_BYTES = 2 * 4 * loader.batch_bytes(64, 224)  # 2 workers x 4 batches of 64 x 224 px: 77 MB


def installed_over(folder, name, version):
    """A distribution `name` `version` in `folder`, as pip install --user --target would leave its metadata."""
    info = Path(folder) / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


def run_env(*args, env=None):
    return subprocess.run(
        torchlab_command("env", *args), capture_output=True, text=True, env=env or TRAIN_ENV, timeout=120, check=False
    )


def one_record(run_dir, name="environment.json"):
    return json.loads((Path(run_dir) / name).read_text())


def test_the_record_holds_the_packages_versions_machine_and_the_plan_as_used(sample_set, tmp_path):
    run_dir = tmp_path / "run"
    done = run_train("--data", sample_set, "--run-dir", run_dir, *QUICK_RUN, "--max-steps", "1")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stdout + done.stderr
    record = one_record(run_dir)
    plan = read_metrics(run_dir, "loader_plan")[0]
    assert record["loader_plan"] == {k: v for k, v in plan.items() if k not in ("kind", "epoch", "step")}
    assert record["loader_plan"] == json.loads((run_dir / "config.json").read_text())["loader_plan"]
    names = {dist["name"]: dist for dist in record["packages"]["distributions"]}
    assert names["numpy"]["version"] == numpy.__version__
    assert {"torch", "torchvision", "pillow"} <= names.keys()
    assert record["versions"]["torch"] == __import__("torch").__version__
    assert record["machine"]["cpus"] == len(os.sched_getaffinity(0))
    assert record["machine"]["shm_bytes"] == machine.shared_memory_bytes()[0]
    assert record["command"]["flags"][:2] == ["--data", str(sample_set)]
    assert record["command"]["cwd"] == os.getcwd()


@pytest.mark.small_shm
def test_under_a_small_dev_shm_the_record_holds_the_lowered_plan(sample_set, tmp_path):
    shm = machine.shared_memory_bytes()
    if shm is None or shm[1] >= ASKED_IN_FLIGHT_BYTES:
        pytest.skip("needs a /dev/shm with less than 77 MB free (docker run --shm-size=64m)")
    run_dir = tmp_path / "run"
    flags = (
        "--loader",
        "processes",
        "--workers",
        "2",
        "--prefetch-factor",
        "4",
        "--image-size",
        "224",
        "--batch-size",
        "64",
    )
    done = run_train("--data", sample_set, "--run-dir", run_dir, *QUICK_RUN, *flags, "--max-steps", "1")
    assert done.returncode == 0, done.stderr
    plan = one_record(run_dir)["loader_plan"]
    assert plan["workers"] * plan["prefetch_factor"] < 2 * 4
    assert plan["reasons"]["workers"].startswith("lowered from 2 x 4"), plan


def test_a_resumed_run_records_again_and_warns_when_a_package_that_matters_changed(sample_set, tmp_path):
    run_dir = tmp_path / "run"
    flags = ("--data", sample_set, "--run-dir", run_dir, *QUICK_RUN)
    assert run_train(*flags, "--max-steps", "1").returncode == 0
    same = run_train(*flags, "--max-steps", "2")
    assert same.returncode == 0, same.stderr
    assert "WARNING" not in same.stdout
    assert sorted(path.name for path in run_dir.glob("environment*")) == ["environment.json"]

    overlay = installed_over(tmp_path / "user-site", "numpy", "9.9.9")
    env = {**TRAIN_ENV, "PYTHONPATH": f"{overlay}{os.pathsep}{ROOT}"}
    changed = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *map(str, flags), "--max-steps", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert changed.returncode == 0, changed.stderr
    warnings = [line for line in changed.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, changed.stdout
    assert f"package changed: numpy {numpy.__version__} -> 9.9.9" in warnings[0]
    assert "stopped by --max-steps 3" in changed.stdout
    first, second = one_record(run_dir), one_record(run_dir, "environment-2.json")
    numpy_now = next(dist for dist in second["packages"]["distributions"] if dist["name"] == "numpy")
    image_copy = {"version": numpy.__version__, "location": os.path.dirname(numpy.__path__[0])}
    assert numpy_now == {"name": "numpy", "version": "9.9.9", "location": str(overlay), "shadows": [image_copy]}
    assert first["packages"] != second["packages"]


def test_env_diff_names_a_changed_an_added_and_a_removed_package(sample_set, tmp_path):
    run_dir = tmp_path / "run"
    overlay = installed_over(tmp_path / "before", "torchlab-test-removed", "1.0")
    env = {**TRAIN_ENV, "PYTHONPATH": f"{overlay}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "--data",
            str(sample_set),
            "--run-dir",
            str(run_dir),
            *QUICK_RUN,
            "--max-steps",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert run_env("diff", run_dir, env=env).returncode == 0

    after = tmp_path / "after"
    installed_over(after, "numpy", "9.9.9")
    installed_over(after, "torchlab-test-added", "2.0")
    diff = run_env("diff", run_dir, env={**TRAIN_ENV, "PYTHONPATH": f"{after}{os.pathsep}{ROOT}"})
    assert diff.returncode == 1, diff.stderr
    assert diff.stdout.splitlines() == [
        f"package changed: numpy {numpy.__version__} -> 9.9.9",
        "package added: torchlab-test-added 2.0",
        "package removed: torchlab-test-removed 1.0",
    ]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda run_dir: run_dir / "missing", "no such folder; expected a run directory"),
        (lambda run_dir: run_dir, "no environment.json"),
        (lambda run_dir: (run_dir / "environment.json").write_text("{not json") and run_dir, "environment.json: "),
    ],
    ids=["no folder", "no record", "bad record"],
)
def test_env_diff_of_bad_input_is_one_line_and_exit_2(tmp_path, make, expected):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    diff = run_env("diff", make(run_dir))
    assert diff.returncode == 2
    assert diff.stdout == ""
    assert len(diff.stderr.splitlines()) == 1 and expected in diff.stderr, diff.stderr


def test_a_record_that_cannot_be_written_is_one_warning_and_the_run_goes_on(sample_set, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "environment.json").mkdir(parents=True)  # where the record goes, a folder: os.replace fails
    done = run_train("--data", sample_set, "--run-dir", run_dir, *QUICK_RUN, "--max-steps", "1")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "environment record was not written" in warnings[0], done.stdout
    assert "stopped by --max-steps 1" in done.stdout


def git(repository, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repository,
        check=True,
        capture_output=True,
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_code_in_a_git_work_tree_is_recorded_with_its_diff_capped(sample_set, tmp_path):
    repository = tmp_path / "experiment"
    repository.mkdir()
    shutil.copy(ROOT / "train.py", repository / "train.py")
    (repository / "notes.txt").write_text("first\n")
    (repository / "run.json").write_text('{"max-steps": 1}')
    git(repository, "init", "-q", "-b", "trial")
    git(repository, "add", ".")
    git(repository, "commit", "-q", "-m", "first")
    (repository / "notes.txt").write_text("x" * (environment.PATCH_LIMIT_BYTES + 1000))
    run_dir = tmp_path / "run"
    env = {**TRAIN_ENV, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            str(repository / "train.py"),
            "--config",
            str(repository / "run.json"),
            "--data",
            str(sample_set),
            "--run-dir",
            str(run_dir),
            *QUICK_RUN,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [state] = one_record(run_dir)["code"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repository, capture_output=True, text=True, check=True)
    assert (state["repository"], state["branch"], state["commit"]) == (str(repository), "trial", head.stdout.strip())
    assert state["patch"] == "environment.patch" and state["patch_truncated"]
    patch = (run_dir / "environment.patch").read_bytes()
    assert len(patch) == environment.PATCH_LIMIT_BYTES and patch.startswith(b"diff --git a/notes.txt")


def test_env_export_installs_back_with_pip_from_what_is_installed(tmp_path):
    """`pip install --no-index -r` in a fresh venv that sees the image's packages: it passes only when every
    pin is exactly an installed version and nothing a pinned package depends on is missing; a wrong pin fails.
    (That PyPI serves each pin is not tested: no network here.)"""
    lock = tmp_path / "requirements.txt"
    export = run_env("export", "-o", lock)
    assert export.returncode == 0, export.stderr
    assert export.stdout.startswith("wrote a pip requirements lock")
    lines = lock.read_text().splitlines()
    assert f"numpy=={numpy.__version__}" in lines
    assert not [line for line in lines if line.startswith("torchlab")]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    image_sites = sorted({dist["location"] for dist in environment.distributions()})
    (site / "image.pth").write_text("".join(f"{folder}\n" for folder in image_sites))

    def pip_install(requirements):
        command = [venv / "bin/python", "-m", "pip", "install", "--no-index", "-r", requirements]
        return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)

    installed = pip_install(lock)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "Successfully installed" not in installed.stdout

    wrong = tmp_path / "wrong.txt"
    wrong.write_text(lock.read_text().replace(f"numpy=={numpy.__version__}", "numpy==1.0.0"))
    assert pip_install(wrong).returncode != 0


def test_env_export_to_stdout_says_what_it_wrote_on_stderr_and_bad_output_is_exit_2(tmp_path):
    printed = run_env("export")
    assert printed.returncode == 0
    assert "wrote a pip requirements lock (pip install -r FILE) to stdout" in printed.stderr
    assert f"numpy=={numpy.__version__}" in printed.stdout.splitlines()
    missing = run_env("export", "-o", tmp_path / "no" / "such" / "lock.txt")
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1 and "no folder" in missing.stderr
    assert not (tmp_path / "no").exists()


CONDA_EXPORT = """name: torchlab
channels:
  - pytorch
  - conda-forge
dependencies:
  - python=3.10.14
  - numpy=1.26.4
  - pip=24.0
  - pip:
      - tensorboard==2.17.0
      - torchlab==0.2.0
"""


def test_the_conda_export_gets_the_user_overlay_in_its_pip_section_and_loses_torchlab(tmp_path):
    """The conda path's file, from what `conda env export --no-builds` prints (no conda here to run it)."""
    yaml = pytest.importorskip("yaml")
    prefix, user_site = tmp_path / "env", tmp_path / "workspace/.local/lib/python3.10/site-packages"
    dists = [
        {"name": "numpy", "version": "2.1.0", "location": str(user_site)},
        {"name": "tensorboard", "version": "2.17.0", "location": str(prefix / "lib/python3.10/site-packages")},
        {"name": "torchlab", "version": "0.2.0", "location": str(prefix / "lib/python3.10/site-packages")},
    ]
    spec = yaml.safe_load(env_tool.conda_lock(CONDA_EXPORT, dists, str(prefix)))
    assert "prefix" not in spec
    assert spec["dependencies"] == [
        "python=3.10.14",
        "numpy=1.26.4",
        "pip=24.0",
        {"pip": ["tensorboard==2.17.0", "numpy==2.1.0"]},
    ]
