import warnings

import pytest
import torch

from mlip_unc.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def test_round_trip_weights_only(tmp_path):
    path = save_checkpoint(
        tmp_path / "m.pt",
        {"kind": "x", "model_state": {"w": torch.ones(2)}, "config": {"a": [1, 2]}},
    )
    out = load_checkpoint(path, kind="x")
    assert torch.equal(out["model_state"]["w"], torch.ones(2)) and out["config"] == {"a": [1, 2]}
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "empty"])
def test_damaged_checkpoint_gives_clear_error(tmp_path, damage):
    path = save_checkpoint(
        tmp_path / "m.pt", {"kind": "x", "model_state": {"w": torch.randn(1000)}}
    )
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "empty": b""}[damage])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("name", "content", "looks_like"),
    [
        ("config.yaml", b"seed: 0\ndata:\n  r_max: 4.0\n", "YAML text"),
        ("notes.txt", b"not a checkpoint " * 10, "text"),
        ("metrics.json", b'{"rmse": 0.1}', "JSON text"),
        ("train.xyz", b"2\nProperties=species:S:1:pos:R:3\nCu 0 0 0\nCu 1 1 1\n", "XYZ"),
        ("weights.npy", b"\x93NUMPY\x01\x00" + bytes(50), "NumPy"),
        ("blob.bin", bytes(range(1, 255)) * 2, "binary data"),
    ],
)
def test_a_file_of_another_format_is_named_not_a_checkpoint(tmp_path, name, content, looks_like):
    """The error says what the file looks like and repeats none of torch's advice."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert message.startswith(f"{path} is not an mlip-unc checkpoint: it holds") and (
        looks_like in message
    )
    assert "weights_only" not in message and "truncated" not in message


def test_a_checkpoint_without_digest_warns_and_resave_adds_one(tmp_path):
    from mlip_unc.models.checkpoint import CheckpointWarning, resave_checkpoint

    path = tmp_path / "old.pt"
    torch.save({"format": "mlip_unc", "version": 1, "kind": "x", "config": {"a": 1}}, path)
    with pytest.warns(CheckpointWarning, match="no SHA-256 digest") as record:
        assert load_checkpoint(path)["config"] == {"a": 1}
    message = str(record[0].message)
    assert str(path) in message and f"resave_checkpoint('{path}')" in message
    resave_checkpoint(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning any more
        payload = load_checkpoint(path, kind="x")
    assert payload["config"] == {"a": 1} and payload["digest"] == 2 and payload["sha256"]


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


def test_changed_config_or_metadata_is_detected(tmp_path):
    """The digest covers non-tensor values too: a changed number in the config is refused."""
    payload = {
        "kind": "potential",
        "model_state": {"w": torch.ones(3)},
        "config": {"r_max": 5.0, "name": "abc"},
    }
    path = save_checkpoint(tmp_path / "m.pt", payload)
    raw = torch.load(path, weights_only=True)
    assert raw["digest"] == 2
    for key, value in (("r_max", 6.0), ("name", "abd")):
        tampered = {**raw, "config": {**raw["config"], key: value}}
        torch.save(tampered, path)  # bypasses save_checkpoint: the stored digest is now stale
        with pytest.raises(CheckpointError, match="SHA-256"):
            load_checkpoint(path)


def test_tensor_only_digest_of_older_checkpoints_still_checked(tmp_path):
    from mlip_unc.models.checkpoint import tensor_digest

    old = {
        "format": "mlip_unc",
        "version": 1,
        "kind": "x",
        "model_state": {"w": torch.ones(3)},
        "config": {"a": 1},
    }
    old["sha256"] = tensor_digest(old)  # digest 1: tensors only
    torch.save(old, tmp_path / "old.pt")
    assert load_checkpoint(tmp_path / "old.pt")["config"] == {"a": 1}
    old["model_state"] = {"w": torch.zeros(3)}
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="its tensors"):
        load_checkpoint(tmp_path / "old.pt")
