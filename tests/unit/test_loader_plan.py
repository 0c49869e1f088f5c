"""The loader plan (issues 26 and 36): one pure function turns the flags as asked, autotune's saved setting, the
machine (CPUs, /dev/shm, CUDA) and the data into what the loader does, with the reason for each; train.py makes
it once and records it, beside the flags as asked, in its start line, metrics.jsonl's first record and
config.json."""

import dataclasses
import json
import re

import pytest
import torch

from conftest import QUICK_RUN, given_plan
from torchlab import config, machine, resolve, train
from torchlab.data import decode, splits
from torchlab.pipeline import device_decode, gil, loader, plan

MB = 1_000_000
BATCH_256 = loader.batch_bytes(256, 224)  # 38.5 MB


def plan_for(
    tuned=None, shm_free=64 * MB, one_batch=BATCH_256, cpus=2, cuda=False, mostly_jpegs=True, memory=None, **asked
):
    data = plan.Data(batch_bytes={"cpu": one_batch, "gpu": one_batch}, mostly_jpegs=mostly_jpegs)
    return plan.plan(plan.Asked(**asked), tuned, machine.Machine(cpus, shm_free, 1, cuda, memory), data)


def test_auto_takes_threads_where_dev_shm_cannot_hold_the_workers_batches():
    """Docker's default 64 MB /dev/shm: batch 256 of 224 px does not fit one worker process (it refused to start,
    issue 26); auto then decodes in threads with the CPUs' share of them, and says why."""
    used = plan_for()
    assert (used.loader, used.workers, used.prefetch_factor) == ("threads", 2, plan.DEFAULT_THREAD_BATCHES_AHEAD)
    assert "/dev/shm has 64 MB free" in used.reasons["loader"]
    assert "threads" in used.describe() and "/dev/shm" in used.describe()
    with pytest.raises(plan.SharedMemoryError, match="--loader threads"):
        plan_for(loader="processes")


def test_processes_lowered_to_fit_are_recorded_as_lowered():
    """Batch 128: what --loader processes fits in 64 MB is 1 worker x 1 (0.36-0.56x speed), recorded so: config.json
    said prefetch_factor 4 and the workers asked for (issue 26)."""
    used = plan_for(loader="processes", one_batch=loader.batch_bytes(128, 224))
    assert (used.loader, used.workers, used.prefetch_factor, used.batches_in_flight) == ("processes", 1, 1, 1)
    assert used.reasons["workers"].startswith("lowered from 2 x 4")
    roomy = plan_for(loader="processes", one_batch=loader.batch_bytes(128, 224), shm_free=1000 * MB)
    assert (roomy.workers, roomy.prefetch_factor, "workers" in roomy.reasons) == (2, 4, True)  # the auto reason


def test_a_saved_setting_gives_loader_workers_and_batches_for_workers_auto():
    tuned = {
        "loader": "processes",
        "workers": 3,
        "prefetch_factor": 8,
        "jpeg_draft": False,
        "tuned_at": "2025-01-02T03:04:05+0000",
    }
    used = plan_for(tuned, shm_free=None)
    assert (used.loader, used.workers, used.prefetch_factor, used.jpeg_draft, used.autotuned) == (
        "processes",
        3,
        8,
        False,
        True,
    )
    assert used.reasons["workers"] == "autotuned (saved 2025-01-02, for these flags)"
    explicit = plan_for(tuned, shm_free=None, workers=1)
    assert (explicit.loader, explicit.workers, explicit.autotuned) == (plan.DEFAULT_LOADER, 1, False)
    old = plan_for({k: v for k, v in tuned.items() if k != "loader"}, shm_free=None)  # saved before threads
    assert old.loader == "processes"


def test_workers_0_decodes_in_the_loop():
    used = plan_for(workers=0)
    assert (used.loader, used.workers, used.batches_in_flight) == ("threads", 0, 0)
    assert "decoded in the training loop" in used.describe()


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), {"loader": "threads", "workers": 2, "prefetch_factor": plan.DEFAULT_THREAD_BATCHES_AHEAD}),
        (("--loader", "processes"), {"loader": "processes", "workers": 1, "prefetch_factor": 1}),
    ],
)
def test_train_records_the_plan_it_used(
    sample_set, tmp_path, capsys, monkeypatch, signal_handlers_restored, flags, expected
):
    """/dev/shm made small for batch 16 x 224 px (2.4 MB): 8 MB free holds one worker's one batch, no more. The
    start line, metrics.jsonl's first record and config.json all show the loader as used, with the reason;
    config.json's flags stay as asked."""
    monkeypatch.setattr(machine, "shared_memory_bytes", lambda path=machine.SHM_PATH: (64 * MB, 8 * MB))
    monkeypatch.setattr(machine, "usable_cpu_count", lambda cgroup_root=None: 2)
    run_dir = tmp_path / "run"
    quick = [flag for flag in QUICK_RUN]
    quick[quick.index("--image-size") + 1] = "224"
    train.main(
        ["--data", str(sample_set), "--run-dir", str(run_dir), "--loader-only", "--max-steps", "2", *flags, *quick]
    )

    out = capsys.readouterr().out
    config = json.loads((run_dir / "config.json").read_text())
    first = read_jsonl(run_dir / "metrics.jsonl")[0]
    assert {key: config["loader_plan"][key] for key in expected} == expected
    assert (config["workers"], config["prefetch_factor"]) == ("auto", None)
    assert config["loader"] == ("processes" if flags else "auto")
    assert first["kind"] == "loader_plan" and first == {
        "kind": "loader_plan",
        "epoch": 0,
        "step": 0,
        **config["loader_plan"],
    }
    assert first["loader"] == expected["loader"] and first["workers"] == expected["workers"]
    reason = first["reasons"]["loader" if not flags else "workers"]
    assert "/dev/shm has 8 MB free" in reason
    fields = {key: value for key, value in first.items() if key in plan.LoaderPlan.__dataclass_fields__}
    assert f"loader: {plan.LoaderPlan(**fields).describe()}" in out


def test_decode_auto_is_gpu_on_cuda_where_most_files_are_jpegs_else_cpu_or_what_autotune_saved():
    assert plan_for(cuda=True).decode == "gpu"
    assert plan_for(cuda=True, mostly_jpegs=False).decode == "cpu"
    on_the_cpu = plan_for(cuda=False)
    assert on_the_cpu.decode == "cpu" and on_the_cpu.reasons["decode"] == "auto: no CUDA device"
    assert plan_for(cuda=True, decode="cpu").decode == "cpu" and plan_for(decode="gpu").decode == "gpu"
    tuned = {"workers": 1, "prefetch_factor": 2, "jpeg_draft": True, "decode": "cpu", "tuned_at": "2026-01-02"}
    assert plan_for(tuned, cuda=True).decode == "cpu"  # saved for these flags, with --workers auto
    assert plan_for(tuned, cuda=True, workers=1).decode == "gpu"  # an explicit --workers reads nothing saved


def test_workers_beyond_the_machine_are_refused_with_the_most_allowed():
    """Worker processes: 4 per usable CPU (each a copy of the training process); decode threads: 32 (each a stack,
    useful for samples that mostly wait)."""
    assert plan_for(workers=8, cpus=2, shm_free=None, loader="processes").workers == 8
    expected = r"^--workers 9: expected at most 8 worker processes \(4 per usable CPU, 2 here\), or auto$"
    with pytest.raises(plan.PlanError, match=expected):
        plan_for(workers=9, cpus=2, loader="processes", shm_free=None)
    assert plan_for(workers=64, cpus=2, loader="threads").workers == 64
    expected = r"^--workers 65: expected at most 64 decode threads \(32 per usable CPU, 2 here\), or auto$"
    with pytest.raises(plan.PlanError, match=expected):
        plan_for(workers=65, cpus=2)


def test_batches_held_beyond_the_free_memory_are_refused_with_what_fits():
    """A --prefetch-factor of 3044578022 made the thread loader allocate a ring of that many batches: the run grew
    until the machine ran out of memory (CI's property test hung for an hour on it). The plan refuses batches that
    cannot all be held at once, with the most that would be, and takes those that can."""
    memory = 10 * BATCH_256  # ten batches
    assert plan_for(memory=memory, prefetch_factor=9).prefetch_factor == 9  # 9 ahead and the one in use
    expected = (
        r"^--prefetch-factor 10 \(--batch-size 256\): the loader would hold 11 batches of 38\.5 MB at once, 424 MB, "
        r"more than the 385 MB of memory free here; expected --prefetch-factor at most 9$"
    )
    with pytest.raises(plan.PlanError, match=expected):
        plan_for(memory=memory, prefetch_factor=10, batch_size=256)
    with pytest.raises(plan.PlanError, match="3,044,578,023 batches .* at most 9$"):
        plan_for(memory=memory, prefetch_factor=3044578022, batch_size=256)
    # Worker processes: each worker's batches in flight, and the two the main process holds.
    used = plan_for(memory=memory, shm_free=None, loader="processes", workers=2, prefetch_factor=4)
    assert used.batches_in_flight == 8
    with pytest.raises(plan.PlanError, match="11 batches .* expected --prefetch-factor at most 2$"):
        plan_for(memory=memory, shm_free=None, loader="processes", workers=3, prefetch_factor=3)
    with pytest.raises(plan.PlanError, match="expected a smaller --batch-size$"):
        plan_for(memory=BATCH_256 - 1, workers=0)
    assert plan_for(memory=None, prefetch_factor=3044578022).prefetch_factor == 3044578022  # unknown: not refused


def test_the_plan_reads_nothing_from_the_machine_itself(monkeypatch):
    """Pure: the same inputs give the same plan, and the machine it is given is the only one it knows."""

    def no_probe(*args):
        raise AssertionError("the plan probed the machine")

    monkeypatch.setattr(machine, "usable_cpu_count", no_probe)
    monkeypatch.setattr(machine, "shared_memory_bytes", no_probe)
    monkeypatch.setattr(machine, "memory_free", no_probe)
    assert plan_for(cpus=3) == plan_for(cpus=3) and plan_for(cpus=3).workers == 3


def test_build_loader_takes_batch_size_seed_and_workers_from_the_plan_alone():
    used = plan_for(workers=0, batch_size=5, seed=7, shm_free=None)
    data_loader = loader.build_loader(list(range(12)), used, torch.device("cpu"), shuffle=False)
    assert (data_loader.batch_size, data_loader.sampler.seed, data_loader.threads) == (5, 7, 0)


def test_train_makes_the_loader_plan_once(sample_set, tmp_path, monkeypatch, signal_handlers_restored):
    """Once, after the data index is known: not before it and again after, nor a third time in build_loader."""
    calls = []
    real_plan = plan.plan
    monkeypatch.setattr(plan, "plan", lambda *args: calls.append(args) or real_plan(*args))
    run_dir = tmp_path / "run"
    train.main(["--data", str(sample_set), "--run-dir", str(run_dir), "--loader-only", "--max-steps", "1", *QUICK_RUN])
    assert len(calls) == 1
    asked, tuned, here, data = calls[0]
    assert (asked.workers, tuned, here.processes) == ("auto", None, 1) and data.batch_bytes["cpu"] == 16 * 48 * 48 * 3


def test_auto_picks_processes_where_the_gil_caps_threads_below_them_and_says_so():
    """gil.py's model: one process's threads keep about thread_cpu_ceiling() CPUs decoding; beyond that, with
    room in /dev/shm, --loader auto takes worker processes, and the reason gives both predictions."""
    ceiling, roomy = gil.thread_cpu_ceiling(), 10**12
    beyond = int(ceiling) + 2
    used = plan_for(workers=beyond, cpus=beyond, shm_free=roomy)
    threads, processes = gil.predicted_rates(beyond)
    assert used.loader == "processes" and threads < processes
    assert used.reasons["loader"].startswith(f"auto: on {beyond} CPUs of decoding, threads would cap at {threads:,.0f}")
    assert plan_for(workers=int(ceiling), cpus=64, shm_free=roomy).loader == "threads"  # within the ceiling
    assert plan_for(workers=4 * 8, cpus=8, shm_free=roomy).loader == "threads"  # 8 CPUs decode, however many ask
    assert plan_for(workers=beyond, cpus=beyond, shm_free=64 * MB).loader == "threads"  # no room for processes
    assert plan_for(workers=beyond, cpus=beyond, shm_free=None).loader == "threads"  # no /dev/shm at all
    assert plan_for(workers=beyond, cpus=beyond, shm_free=roomy, loader="threads").loader == "threads"
    # --workers auto starts at most MAX_AUTO_WORKERS, within the measured ceiling: threads, on any machine.
    assert ceiling >= plan.MAX_AUTO_WORKERS and plan_for(cpus=128, shm_free=roomy).loader == "threads"


def test_a_plan_that_cannot_decode_on_the_gpu_reads_no_file(sample_set, monkeypatch):
    """The encoded files' sizes and the JPEG sniff are what --decode gpu needs: without CUDA they are not read."""
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    reads = []
    monkeypatch.setattr(decode, "encoded_bytes", lambda source: reads.append(source) or b"")
    flags = config.parse_args(["--data", str(sample_set), "--autotune-file", "/dev/null"])
    used = resolve.loader_plan(flags, "cpu", train_index)
    assert (used.decode, reads) == ("cpu", [])
    assert set(device_decode.plan_data(train_index, 32, 8).batch_bytes) == {"cpu", "gpu"} and reads  # gpu: read


@pytest.mark.parametrize(
    ("cpus", "processes", "workers"),
    [(1, 1, 1), (2, 1, 2), (12, 1, plan.MAX_AUTO_WORKERS), (6, 4, 1), (16, 2, plan.MAX_AUTO_WORKERS), (8, 2, 4)],
)
def test_workers_auto_is_one_per_cpu_of_the_process_share_at_least_one_at_most_the_cap(cpus, processes, workers):
    assert plan.auto_workers(cpus, processes) == workers
    here = machine.Machine(cpus, None, processes)
    assert plan.plan(plan.Asked(), None, here, plan.Data(batch_bytes={"cpu": MB})).workers == workers


def test_decode_auto_is_gpu_only_on_cuda_with_mostly_jpegs():
    assert plan.auto_decoder(cuda=True, mostly_jpegs=True) == "gpu"
    assert plan.auto_decoder(cuda=True, mostly_jpegs=False) == "cpu"
    assert plan.auto_decoder(cuda=False, mostly_jpegs=True) == "cpu"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: plan.Asked(loader="backend"), "Asked: loader='backend'; expected one of auto, threads, processes"),
        (lambda: plan.Asked(workers=-1), "Asked: workers=-1; expected auto or an integer >= 0"),
        (lambda: plan.Asked(workers=True), "Asked: workers=True; expected auto or an integer >= 0"),
        (lambda: plan.Asked(prefetch_factor=0), "Asked: prefetch_factor=0; expected None or an integer >= 1"),
        (lambda: plan.Asked(jpeg_draft=1), "Asked: jpeg_draft=1; expected None, True or False"),
        (lambda: plan.Asked(decode="tpu"), "Asked: decode='tpu'; expected one of auto, cpu, gpu"),
        (lambda: plan.Asked(batch_size=0), "Asked: batch_size=0; expected an integer >= 1"),
        (lambda: plan.Asked(seed=-1), "Asked: seed=-1; expected an integer >= 0"),
        (lambda: plan.Data(batch_bytes={"gpu": MB}), "Data: batch_bytes={'gpu': 1000000}; expected bytes >= 1"),
        (lambda: plan.Data(batch_bytes={"cpu": 0}), "Data: batch_bytes={'cpu': 0}; expected bytes >= 1"),
        (lambda: given_plan(loader="auto"), "LoaderPlan: loader='auto'; expected one of threads, processes"),
        (lambda: given_plan(workers=-2), "LoaderPlan: workers=-2; expected an integer >= 0"),
        (lambda: given_plan(prefetch_factor=0), "LoaderPlan: prefetch_factor=0; expected an integer >= 1"),
        (
            lambda: dataclasses.replace(given_plan(), decode="auto"),
            "LoaderPlan: decode='auto'; expected one of cpu, gpu",
        ),
        (lambda: given_plan(shm_needed=-1), "LoaderPlan: shm_needed=-1; expected an integer >= 0"),
    ],
)
def test_a_record_with_a_bad_value_is_refused_when_made_naming_the_value_and_what_is_expected(make, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        make()


def test_the_records_are_built_by_keyword_only():
    with pytest.raises(TypeError):
        plan.Asked("threads")
    with pytest.raises(TypeError):
        plan.Data({"cpu": MB})
    with pytest.raises(TypeError):
        plan.LoaderPlan("threads", 2, 2, "cpu", True, False)
