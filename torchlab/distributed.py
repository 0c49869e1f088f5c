"""Several processes under torchrun: who this process is, the process group, and the loop's few collectives.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE (and the rendezvous variables) in each
process it starts; without them this is the only process. NCCL connects the processes on GPUs, gloo on CPUs.
"""

import dataclasses
import os

import torch
import torch.distributed as dist

# The stop vote's tensor lives as long as the interpreter, longer than any process group. A gloo worker
# thread may free its last finished collective (held on by the closing barrier) while the main thread,
# holding the GIL, is in ~ProcessGroupGloo waiting for that thread: if the tensor's Python object had
# already gone, freeing the tensor would need the GIL, and the process would hang at exit after its run
# (pytorch/pytorch#56297; torch 2.8 releases the GIL there, pytorch/pytorch#154976).
_VOTES = torch.zeros(2, dtype=torch.int64)


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
    return values


def any_process(flags, processes):
    """For each of `flags` (a tuple of at most two bools): True on every process when it is true on at least one
    of them. One collective for both."""
    if not processes.is_distributed:
        return flags
    _VOTES.zero_()
    _VOTES[: len(flags)] = torch.tensor(flags, dtype=torch.int64)
    dist.all_reduce(_VOTES, op=dist.ReduceOp.MAX, group=processes.cpu_group)
    return tuple(bool(vote) for vote in _VOTES[: len(flags)].tolist())


def gathered(value, processes):
    """Every process's `value` (any picklable object), in rank order; every process must call this together."""
    if not processes.is_distributed:
        return [value]
    values = [None] * processes.world_size
    dist.all_gather_object(values, value, group=processes.cpu_group)
    return values
