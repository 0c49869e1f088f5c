"""model.py and optim.py: local weights into another head, the learning-rate schedule."""

import pytest
import torch

from torchlab import model, optim


def test_weights_load_except_the_layers_whose_shape_differs(tmp_path):
    torch.manual_seed(0)
    pretrained = model.build_model("resnet18", num_classes=10)
    torch.save(pretrained.state_dict(), tmp_path / "resnet18.pth")
    torch.manual_seed(1)
    fresh = model.build_model("resnet18", num_classes=4)
    fresh_head = fresh.fc.weight.clone()

    kept = model.load_weights(fresh, str(tmp_path / "resnet18.pth"))

    assert kept == ["fc.bias", "fc.weight"]
    assert torch.equal(fresh.conv1.weight, pretrained.conv1.weight)
    assert torch.equal(fresh.layer4[1].bn2.running_var, pretrained.layer4[1].bn2.running_var)
    assert torch.equal(fresh.fc.weight, fresh_head)


def test_weights_that_match_nothing_or_are_no_state_dict_are_refused(tmp_path):
    torch.save({"encoder.weight": torch.zeros(3)}, tmp_path / "other.pth")
    (tmp_path / "text.pth").write_text("not a checkpoint")
    network = model.build_model("resnet18", num_classes=4)

    with pytest.raises(model.WeightsError, match="no tensor matches"):
        model.load_weights(network, str(tmp_path / "other.pth"))
    with pytest.raises(model.WeightsError, match="not a readable PyTorch state dict"):
        model.load_weights(network, str(tmp_path / "text.pth"))


def test_learning_rate_warms_up_linearly_then_decays_by_cosine_to_zero():
    optimizer = optim.build_optimizer([torch.nn.Parameter(torch.zeros(1))], "sgd", 0.4, 0.9, 0.0)
    scheduler = optim.warmup_cosine_schedule(optimizer, warmup_steps=4, total_steps=14)
    rates = []
    for _ in range(14):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()

    assert rates[:4] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert rates[4] == pytest.approx(0.4)
    assert rates[9] == pytest.approx(0.2)  # half-way through the decay
    assert rates[4:] == sorted(rates[4:], reverse=True)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0)
