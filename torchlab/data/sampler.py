"""Which samples each process reads in an epoch, in which order, from any point in it."""

import numpy as np
import torch


class EpochSampler(torch.utils.data.Sampler):
    """This process's share of one epoch's samples, from any point in it: a resumable DistributedSampler.

    Training (train=True): the order is a permutation seeded by (seed, epoch), the same in every process
    and every run, dealt round-robin to the ranks; the last len % world_size samples are left out so
    that every rank has as many. set_epoch(epoch, skip) starts `skip` samples into this rank's share
    without reading those samples. Validation: every sample once, in order, dealt round-robin.

    Yields (position, epoch) keys: ImageDataset seeds each sample's augmentation with them.
    """

    def __init__(self, num_samples, train, seed, rank=0, world_size=1):
        self.num_samples = num_samples
        self.train = train
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.set_epoch(0)

    def set_epoch(self, epoch, skip=0):
        self.epoch = epoch
        self.skip = skip

    def __iter__(self):
        if self.train:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)
        else:
            order = np.arange(self.num_samples)
        share = order[self.rank : self._used_samples() : self.world_size][self.skip :]
        epoch = self.epoch
        return ((int(position), epoch) for position in share)

    def __len__(self):
        return max(0, len(range(self.rank, self._used_samples(), self.world_size)) - self.skip)

    def _used_samples(self):
        return self.num_samples - self.num_samples % self.world_size if self.train else self.num_samples
