"""Which samples each process reads in an epoch, in which order, from any point in it."""

import numpy as np
import torch


class EpochSampler(torch.utils.data.Sampler):
    """This process's share of one epoch's samples, from any point in it: a resumable DistributedSampler.

    Training (train=True): the order is a permutation seeded by (seed, epoch), the same in every process
    and every run, dealt round-robin to the ranks; the last len % world_size samples are left out so
    that every rank has as many. set_epoch(epoch, skip) starts the next pass `skip` samples into this
    rank's share without reading those samples (a resume); the passes after it read the whole share again.
    Validation: every sample once, in order, dealt round-robin.

    len() is what the next pass yields (the share less a skip not yet used); samples_per_epoch() is the whole
    share, whatever the skip: an epoch's step count, as the schedule, the progress bar and the stop test count.

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
        # A generator: the order is made, and the skip used up, when the pass reads its first sample.
        if self.train:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)
        else:
            order = np.arange(self.num_samples)
        share = order[self.rank : self._used_samples() : self.world_size][self.skip :]
        self.skip = 0
        epoch = self.epoch
        for position in share:
            yield int(position), epoch

    def __len__(self):
        return max(0, self.samples_per_epoch() - self.skip)

    def samples_per_epoch(self):
        """This process's share of a whole epoch, however far into it set_epoch's skip starts the next pass."""
        return len(range(self.rank, self._used_samples(), self.world_size))

    def _used_samples(self):
        return self.num_samples - self.num_samples % self.world_size if self.train else self.num_samples
