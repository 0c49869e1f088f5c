"""The network: any torchvision classification model by name, from scratch or from a local weights file."""

import copy

import torch
import torchvision

from torchlab import checkpoint


class WeightsError(ValueError):
    """--weights names a file that cannot be used: reported as one line, exit code 2."""


class ModelInputError(ValueError):
    """The model cannot train on --image-size x --batch-size: reported as one line, exit code 2."""


def classification_model_names():
    return torchvision.models.list_models(module=torchvision.models)


def build_model(arch, num_classes):
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)


def check_trainable(model, batch_size, image_size):
    """One training-mode forward pass of a copy on zeros; raises ModelInputError if the model cannot train
    on this input (too small an image for its downsampling, batch norm over a single value per channel at
    --batch-size 1, or a fixed input size that torchvision asserts, as ViT's). Two images stand for any larger
    batch."""
    probe = copy.deepcopy(model).train()
    try:
        with torch.no_grad():
            probe(torch.zeros(min(batch_size, 2), 3, image_size, image_size))
    except (RuntimeError, ValueError, AssertionError) as error:
        raise ModelInputError(checkpoint.one_line(error)) from None


def load_weights(model, path):
    """Load a state dict file (torchvision's .pth, or a checkpoint of this script) into `model`.

    Tensors whose name or shape does not match (such as a classifier for another number of classes)
    stay as initialised. Returns the names of those, sorted. Nothing is downloaded.
    """
    try:
        state = checkpoint.load_state(path)  # what --resume reads with: any file, one line where it is none
    except checkpoint.CheckpointReadError as reason:
        raise WeightsError(f"--weights {path}: not a readable PyTorch state dict ({reason})") from None
    state = state.get("model", state) if isinstance(state, dict) else state
    if not isinstance(state, dict):
        raise WeightsError(f"--weights {path}: not a state dict (it holds a {type(state).__name__})")
    own_state = model.state_dict()
    matching = {
        name: tensor
        for name, tensor in state.items()
        if name in own_state and isinstance(tensor, torch.Tensor) and own_state[name].shape == tensor.shape
    }
    if not matching:
        raise WeightsError(f"--weights {path}: no tensor matches the model's names and shapes")
    model.load_state_dict(matching, strict=False)
    return sorted(set(own_state) - set(matching))
