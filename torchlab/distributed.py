"""Several processes under torchrun: who this process is, the process group, and the loop's few collectives.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE (and the rendezvous variables) in each
process it starts; without them this is the only process. NCCL connects the processes on GPUs, gloo on CPUs.
"""

import collections
import dataclasses
import os
import pickle

import torch
import torch.distributed as dist

# A gloo worker thread frees the collective it last ran after the main thread has moved on. A group is destroyed
# when its last Python reference goes (when main() returns, not in destroy_process_group), and ~ProcessGroupGloo
# joins those threads holding the GIL. If the tensor's Python object has already gone by then, the thread needs
# the GIL to free it, and the process hangs at exit (pytorch/pytorch#56297, fixed in torch 2.8 by
# pytorch/pytorch#154976; py-spy caught it here: a thread freeing the stop barrier's prior all_reduce). So the
# tensors of the latest collectives (more than the worker threads of both groups can hold) keep their Python
# objects in _LATEST for the life of the process.
_LATEST = collections.deque(maxlen=8)


@dataclasses.dataclass(frozen=True)
class Processes:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    # A gloo group for the per-step stop vote: a CPU collective, so the GPU queue is not drained for it.
    cpu_group: object = None

    @property
    def is_main(self):
        return self.rank == 0

    @property
    def is_distributed(self):
        return self.world_size > 1


def processes_from_environment():
    environment = os.environ
    return Processes(
        rank=int(environment.get("RANK", 0)),
        local_rank=int(environment.get("LOCAL_RANK", 0)),
        world_size=int(environment.get("WORLD_SIZE", 1)),
        local_world_size=int(environment.get("LOCAL_WORLD_SIZE", 1)),
    )


def start(processes, device):
    """Join the process group when there are several processes; returns `processes` with its cpu_group."""
    if not processes.is_distributed:
        return processes
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return dataclasses.replace(processes, cpu_group=dist.new_group(backend="gloo"))


def finish(processes):
    """Leave the process group together: a process that tears its groups down while another is still
    finishing its last steps can leave that one hanging in destroy_process_group (pytorch/pytorch#75097)."""
    if processes.is_distributed:
        dist.barrier(group=processes.cpu_group)
        dist.destroy_process_group()


def sum_over_processes(values, processes):
    """`values` (a tensor) summed over all processes, in place; every process must call this together."""
    if processes.is_distributed:
        dist.all_reduce(values)
        _LATEST.append(values)
    return values


def any_process(flags, processes):
    """For each of `flags` (a tuple of bools): True on every process when it is true on at least one of them. One
    collective for all."""
    if not processes.is_distributed:
        return flags
    votes = torch.tensor(flags, dtype=torch.int64)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=processes.cpu_group)
    _LATEST.append(votes)
    return tuple(bool(vote) for vote in votes.tolist())


def gathered(value, processes):
    """Every process's `value` (any picklable object), in rank order; every process must call this together.
    Pickled, as all_gather_object does, into tensors that _LATEST keeps."""
    if not processes.is_distributed:
        return [value]
    pickled, members = pickle.dumps(value), dist.get_world_size(processes.cpu_group)
    size = torch.tensor([len(pickled)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(members)]
    dist.all_gather(sizes, size, group=processes.cpu_group)
    longest = max(int(each) for each in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(pickled)] = torch.frombuffer(bytearray(pickled), dtype=torch.uint8)
    received = [torch.empty(longest, dtype=torch.uint8) for _ in range(members)]
    dist.all_gather(received, mine, group=processes.cpu_group)
    _LATEST.append((size, sizes, mine, received))
    return [pickle.loads(data[: int(length)].numpy().tobytes()) for data, length in zip(received, sizes, strict=True)]
