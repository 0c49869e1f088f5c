"""distributed.py: the stop vote, the sums and the gathering over a real gloo group (the two-process runs are
test_train's and test_resume's torchrun tests)."""

import gc
import weakref

import pytest
import torch
import torch.distributed as dist

from torchlab import distributed


@pytest.fixture
def gloo_group(tmp_path):
    """A real gloo group of this one process; the Processes below pretend there are two, so that the
    vote goes through the collective as it does under torchrun."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield dist.new_group(backend="gloo")
    finally:
        if dist.is_initialized():  # finish() may have destroyed it
            dist.destroy_process_group()


def test_the_stop_vote_counts_each_call_and_its_tensor_outlives_the_call(gloo_group, monkeypatch):
    processes = distributed.Processes(world_size=2, cpu_group=gloo_group)
    voted = []
    all_reduce = dist.all_reduce

    def recording_all_reduce(tensor, *args, **kwargs):
        voted.append(weakref.ref(tensor))
        return all_reduce(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", recording_all_reduce)

    assert distributed.any_process((True, False), processes) == (True, False)
    assert distributed.any_process((False,), processes) == (False,)  # a true vote does not stay
    gc.collect()
    # gloo's threads may still hold the tensor when the group is torn down; its Python object must not have
    # gone, or freeing it there needs the GIL the tearing-down thread holds, and the process hangs at exit.
    assert len(voted) == 2 and all(ref() is not None for ref in voted)


def test_every_tensor_a_collective_took_outlives_the_groups(gloo_group, monkeypatch):
    """CI hung for 5 minutes at the end of two-process runs: py-spy showed the main thread returning from main()
    and freeing the stop vote's group, joining gloo's threads with the GIL held, and one of those threads freeing
    the barrier's prior all_reduce, whose tensor's Python object had gone (finish() had let it go after
    destroy_process_group, which does not destroy the group). Here each tensor handed to a collective is still
    alive after the calls and after finish(): only the end of the process lets it go."""
    processes = distributed.Processes(world_size=2, cpu_group=gloo_group)
    handed = []
    for name in ("all_reduce", "all_gather"):
        collective = getattr(dist, name)

        def recording(*args, collective=collective, **kwargs):
            for arg in args:
                handed.extend(weakref.ref(tensor) for tensor in (arg if isinstance(arg, list) else [arg]))
            return collective(*args, **kwargs)

        monkeypatch.setattr(dist, name, recording)

    assert distributed.gathered({"bad": ["a.jpg"], "sums": [1, 2]}, processes) == [{"bad": ["a.jpg"], "sums": [1, 2]}]
    assert distributed.sum_over_processes(torch.tensor([3.0, 4.0]), processes).tolist() == [3.0, 4.0]
    distributed.finish(processes)
    gc.collect()
    assert len(handed) == 5 and all(ref() is not None for ref in handed)  # size out and in, data out and in, sum
