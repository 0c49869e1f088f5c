"""distributed.py: the stop vote over a real gloo group (the two-process run is test_train's torchrun test)."""

import gc
import weakref

import pytest
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
