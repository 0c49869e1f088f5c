"""The optimiser and its learning-rate schedule: linear warm-up, then cosine decay to zero, stepped per batch."""

import math

import torch


def build_optimizer(parameters, name, lr, momentum, weight_decay):
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)


def warmup_cosine_schedule(optimizer, warmup_steps, total_steps):
    def lr_factor(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
