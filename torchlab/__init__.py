"""torchlab: train torchvision classifiers from a mounted ImageFolder with a loader near the machine's limit.

train.py            main(): flags, data, model, run dir, then train_one_epoch / evaluate per epoch
config.py           train.py's flags, their checks, and the values "auto" resolves to
loader.py           build_loader (the one DataLoader), the /dev/shm budget, --workers auto, BatchToDevice
checkpoint.py       what a checkpoint holds, writing it atomically, restoring it, keeping the newest
metrics.py          progress lines, metrics.jsonl and TensorBoard
model.py, optim.py  the torchvision model, its weights; the optimiser and schedule
distributed.py      torchrun's processes
io.py               atomic writes; bad input as one line and exit 2
environment.py      the run's environment record (environment.json) and what env diff compares
data/               folder (the ImageFolder index), decode (crop, resize, ImageDataset), sampler,
                    prepared (the packed copy), splits (open either)
tools/              doctor, bench (+ bench_data), autotune, sample_data, env (export, diff)
__main__.py         the `torchlab` command: train, doctor, bench, prepare, sample-data, autotune
"""
