"""The loader plan (issue 26): one function turns the flags, autotune's saved setting, the CPUs and /dev/shm into
what the loader does, with the reason for each; train.py records the plan it used in its start line,
metrics.jsonl's first record and config.json."""

import json

import pytest

from conftest import QUICK_RUN
from torchlab import config, train
from torchlab.pipeline import loader, plan

MB = 1_000_000
BATCH_256 = loader.batch_bytes(256, 224)  # 38.5 MB


def plan_for(tuned=None, shm_free=64 * MB, one_batch=BATCH_256, cpus=2, **asked):
    return plan.plan_loader(plan.AskedLoader(**asked), tuned, cpus, shm_free, one_batch)


def test_auto_takes_threads_where_dev_shm_cannot_hold_the_workers_batches():
    """Docker's default 64 MB /dev/shm: batch 256 of 224 px does not fit one worker process (it refused to start,
    issue 26); auto then decodes in threads with the CPUs' share of them, and says why."""
    used = plan_for()
    assert (used.backend, used.workers, used.prefetch_factor) == ("threads", 2, config.DEFAULT_THREAD_BATCHES_AHEAD)
    assert "/dev/shm has 64 MB free" in used.reasons["backend"]
    assert "threads" in used.describe() and "/dev/shm" in used.describe()
    with pytest.raises(loader.SharedMemoryError, match="--loader threads"):
        plan_for(loader="processes")


def test_processes_lowered_to_fit_are_recorded_as_lowered():
    """Batch 128: what --loader processes fits in 64 MB is 1 worker x 1 (0.36-0.56x speed), recorded so: config.json
    said prefetch_factor 4 and the workers asked for (issue 26)."""
    used = plan_for(loader="processes", one_batch=loader.batch_bytes(128, 224))
    assert (used.backend, used.workers, used.prefetch_factor, used.batches_in_flight) == ("processes", 1, 1, 1)
    assert used.reasons["workers"].startswith("lowered from 2 x 4")
    roomy = plan_for(loader="processes", one_batch=loader.batch_bytes(128, 224), shm_free=1000 * MB)
    assert (roomy.workers, roomy.prefetch_factor, "workers" in roomy.reasons) == (2, 4, True)  # the auto reason


def test_a_saved_setting_gives_backend_workers_and_batches_for_workers_auto():
    tuned = {
        "loader": "processes",
        "workers": 3,
        "prefetch_factor": 8,
        "jpeg_draft": False,
        "tuned_at": "2025-01-02T03:04:05+0000",
    }
    used = plan_for(tuned, shm_free=None)
    assert (used.backend, used.workers, used.prefetch_factor, used.jpeg_draft, used.autotuned) == (
        "processes",
        3,
        8,
        False,
        True,
    )
    assert used.reasons["workers"] == "autotuned (saved 2025-01-02, for these flags)"
    explicit = plan_for(tuned, shm_free=None, workers=1)
    assert (explicit.backend, explicit.workers, explicit.autotuned) == (config.DEFAULT_BACKEND, 1, False)
    old = plan_for({k: v for k, v in tuned.items() if k != "loader"}, shm_free=None)  # saved before threads
    assert old.backend == "processes"


def test_workers_0_decodes_in_the_loop():
    used = plan_for(workers=0)
    assert (used.backend, used.workers, used.batches_in_flight) == ("threads", 0, 0)
    assert "decoded in the training loop" in used.describe()


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), {"loader": "threads", "workers": 2, "prefetch_factor": config.DEFAULT_THREAD_BATCHES_AHEAD}),
        (("--loader", "processes"), {"loader": "processes", "workers": 1, "prefetch_factor": 1}),
    ],
)
def test_train_records_the_plan_it_used(
    sample_set, tmp_path, capsys, monkeypatch, signal_handlers_restored, flags, expected
):
    """/dev/shm made small for batch 16 x 224 px (2.4 MB): 8 MB free holds one worker's one batch, no more. The
    start line, metrics.jsonl's first record and config.json all show the loader as used, with the reason."""
    monkeypatch.setattr(loader, "shared_memory_bytes", lambda path=loader.SHM_PATH: (64 * MB, 8 * MB))
    monkeypatch.setattr(loader, "usable_cpu_count", lambda cgroup_root=None: 2)
    run_dir = tmp_path / "run"
    quick = [flag for flag in QUICK_RUN]
    quick[quick.index("--image-size") + 1] = "224"
    train.main(
        ["--data", str(sample_set), "--run-dir", str(run_dir), "--loader-only", "--max-steps", "2", *flags, *quick]
    )

    out = capsys.readouterr().out
    config = json.loads((run_dir / "config.json").read_text())
    first = read_jsonl(run_dir / "metrics.jsonl")[0]
    assert {key: config[key] for key in expected} == expected
    assert first["kind"] == "loader_plan" and first == {
        "kind": "loader_plan",
        "epoch": 0,
        "step": 0,
        **config["loader_plan"],
    }
    assert first["backend"] == expected["loader"] and first["workers"] == expected["workers"]
    reason = first["reasons"]["backend" if not flags else "workers"]
    assert "/dev/shm has 8 MB free" in reason
    fields = {key: value for key, value in first.items() if key in plan.LoaderPlan.__dataclass_fields__}
    assert f"loader: {plan.LoaderPlan(**fields).describe()}" in out
