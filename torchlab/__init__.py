"""torchlab: train torchvision classifiers from a mounted ImageFolder with a loader near the machine's limit.

Layers, bottom first, each importing only its own and those below it (tests/static/test_layers.py holds them):
io, parsing, machine, flavour, activity -> data, pipeline, model, optim, distributed, checkpoint, metrics,
environment -> config -> resolve, train -> tools -> cli, jupyter_activity.

io.py               atomic writes; bad input as one line and exit 2
parsing.py          argument types that check a flag's text, the parser whose errors are one line
machine.py          the usable CPUs (affinity, cgroup quota) and /dev/shm, read once as a Machine
flavour.py          the image's flavours (buildtools/flavours.tsv) and whether this torch runs on the GPUs seen
activity.py         a live run's record, which idle cullers see through jupyter_activity
data/               folder (the ImageFolder index), decode (crop, resize, ImageDataset), prepared (the packed
                    copy), splits (open either)
pipeline/           plan (the loader plan: flags, autotune's setting, machine, data -> what the loader does; the
                    pipeline's defaults), build (build_input: the plan's loaders and device step), loader
                    (build_loader, BatchToDevice, timed_pass), threads, sampler,
                    device_decode (the device step), settings (autotune's store), public (create_loader), gil (the
                    GIL model of threads against processes)
model.py, optim.py  the torchvision model, its weights; the optimiser and schedule
distributed.py      torchrun's processes
checkpoint.py       what a checkpoint holds, writing it atomically, restoring it, keeping the newest
metrics.py          progress lines, metrics.jsonl and TensorBoard
environment.py      the run's environment record (environment.json) and what env diff compares
config.py           train.py's flags: declared once (TrainConfig, as asked, frozen), their defaults, help, checks
resolve.py          what the flags need from the machine (Setup: device, precision, lr, resume) and the loader plan
train.py            main(): flags, data, plan, model, run dir, then train_one_epoch / evaluate per epoch
tools/              commands over the core: doctor, bench (+ bench_data, bench_gil), autotune, gpu_check, prepare,
                    sample_data, env (export, diff)
cli.py              the `torchlab COMMAND` table
jupyter_activity.py the Jupyter server extension that turns live runs into the server's activity
"""
