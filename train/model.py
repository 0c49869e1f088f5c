"""The network: any torchvision classification model by name, from scratch or from a local weights file."""

import pickle

import torch
import torchvision


class WeightsError(ValueError):
    """--weights names a file that cannot be used: reported as one line, exit code 2."""


def classification_model_names():
    return torchvision.models.list_models(module=torchvision.models)


def build_model(arch, num_classes):
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)


def load_weights(model, path):
    """Load a state dict file (torchvision's .pth, or a checkpoint of this script) into `model`.

    Tensors whose name or shape does not match (such as a classifier for another number of classes)
    stay as initialised. Returns the names of those, sorted. Nothing is downloaded.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, pickle.UnpicklingError) as error:
        raise WeightsError(f"--weights {path}: not a readable PyTorch state dict ({error})".splitlines()[0]) from None
    state = state.get("model", state)
    own_state = model.state_dict()
    matching = {
        name: tensor for name, tensor in state.items() if name in own_state and own_state[name].shape == tensor.shape
    }
    if not matching:
        raise WeightsError(f"--weights {path}: no tensor matches the model's names and shapes")
    model.load_state_dict(matching, strict=False)
    return sorted(set(own_state) - set(matching))
