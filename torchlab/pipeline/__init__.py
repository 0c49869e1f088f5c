"""The input pipeline: the loaders (decode threads, or worker processes), the sampler, the loader plan and
autotune's settings store. create_loader gives the tuned loader for a user's own map-style Dataset."""


def create_loader(*args, **kwargs):
    """See torchlab.pipeline.public.create_loader."""
    from torchlab.pipeline import public

    return public.create_loader(*args, **kwargs)
