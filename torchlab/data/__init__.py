"""The data: folder (which files, which labels, which split), decode (crop, resize, the Dataset), sampler (which
samples each process reads, in which order), prepared (a packed copy for speed) and splits (open either)."""
