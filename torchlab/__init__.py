"""torchlab: train torchvision classifiers from a mounted ImageFolder with a loader near the machine's limit.

Layers, each importing only those before it: cli -> config -> core -> tools.

cli.py              argument types, the parser whose errors are one line, the `torchlab` command table
config.py           train.py's flags: declared once (TrainConfig), their defaults, help and checks (no torch)
resolve.py          what "auto" and the flags' checks need from the machine: CUDA, CPUs, checkpoints, the plan
train.py            main(): flags, data, model, run dir, then train_one_epoch / evaluate per epoch
checkpoint.py       what a checkpoint holds, writing it atomically, restoring it, keeping the newest
metrics.py          progress lines, metrics.jsonl and TensorBoard
model.py, optim.py  the torchvision model, its weights; the optimiser and schedule
distributed.py      torchrun's processes
io.py               atomic writes; bad input as one line and exit 2
environment.py      the run's environment record (environment.json) and what env diff compares
data/               folder (the ImageFolder index), decode (crop, resize, ImageDataset), prepared (the packed
                    copy), splits (open either)
pipeline/           loader (build_loader, /dev/shm), threads, sampler, device_decode (the device step), plan,
                    settings (autotune's store), public (create_loader for a user's Dataset)
tools/              commands over the core: doctor, bench (+ bench_data), autotune, gpu_check, prepare,
                    sample_data, env (export, diff)
"""
