import pytest
import torch

from mlip_unc.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def test_round_trip_weights_only(tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", {"kind": "x", "model_state": {"w": torch.ones(2)}, "config": {"a": [1, 2]}})
    out = load_checkpoint(path, kind="x")
    assert torch.equal(out["model_state"]["w"], torch.ones(2)) and out["config"] == {"a": [1, 2]}
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_checkpoint_gives_clear_error(tmp_path, damage):
    path = save_checkpoint(tmp_path / "m.pt", {"kind": "x", "model_state": {"w": torch.randn(1000)}})
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"not a checkpoint" * 10, "empty": b""}[damage])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(path)


def test_pickled_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "mlip_unc", "obj": CheckpointError("x")}, path)
    with pytest.raises(CheckpointError, match=str(path.name)):
        load_checkpoint(path)


def test_wrong_kind_and_missing(tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", {"kind": "property"})
    with pytest.raises(CheckpointError, match="expected 'potential'"):
        load_checkpoint(path, kind="potential")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")


def test_flipped_bits_in_a_weight_tensor_are_detected(tmp_path):
    """A checkpoint that still unpickles but whose tensor bytes changed is refused (SHA-256)."""
    import torch

    from mlip_unc.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    weights = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    path = save_checkpoint(tmp_path / "m.pt", {"kind": "potential", "model_state": {"w": weights}})
    assert load_checkpoint(path)["sha256"]
    data = bytearray(path.read_bytes())
    start = bytes(data).find(weights.numpy().tobytes()[400:432])
    assert start > 0
    data[start + 5] ^= 0x20  # one flipped bit inside the tensor data
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_checkpoint(path)


def test_a_pickled_object_is_refused_with_the_right_reason(tmp_path):
    path = tmp_path / "pickled.pt"
    torch.save({"format": "mlip_unc", "obj": ValueError("code, not data")}, path)
    with pytest.raises(CheckpointError, match="pickled Python objects"):
        load_checkpoint(path)
