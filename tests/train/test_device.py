"""``train.device``: resolution, clear errors, resume across devices, and (with a GPU) CUDA training
that matches the CPU's."""

import pytest
import torch
from torch_geometric.utils import from_smiles
from typer.testing import CliRunner

from mlip_unc.cli import app
from mlip_unc.config import ConfigError, PropertyConfig
from mlip_unc.models.checkpoint import load_checkpoint, save_checkpoint
from mlip_unc.models.factory import build_model
from mlip_unc.train.device import resolve_device
from mlip_unc.train.property import property_trainer, target_statistics

SMILES = [
    "C",
    "CC",
    "CCC",
    "CCCC",
    "CO",
    "CCO",
    "CCCO",
    "CC(C)O",
    "CC(=O)O",
    "c1ccccc1",
    "Cc1ccccc1",
    "Oc1ccccc1",
    "c1ccncc1",
    "C1CCCCC1",
    "CN",
    "CCN",
    "CC#N",
    "C=C",
    "ClC",
    "CCCl",
]
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def graphs():
    out = []
    for k, smi in enumerate(SMILES):
        g = from_smiles(smi)
        g.y = torch.tensor([[0.3 * g.x.shape[0] + 0.05 * (k % 3)]])
        out.append(g)
    return out


def trainer(graphs, out_dir=None, method="bgnn", **train):
    base = {"epochs": 3, "batch_size": 4, "progress": False, "patience": 0, "lr": 0.01}
    cfg = PropertyConfig.from_dict(
        {
            "model": {"method": method, "hidden": 8, "layers": 2, "latent_dim": 4},
            "train": {**base, **train},
        }
    )
    torch.manual_seed(0)
    mean, std = target_statistics(graphs[:14])
    model = build_model(cfg, y_mean=mean, y_std=std)
    return property_trainer(model, cfg, graphs[:14], graphs[14:], out_dir=out_dir)


def test_resolve_device_names_the_setting_when_it_cannot_run():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto", cuda_available=False) == torch.device("cpu")
    assert resolve_device("auto", cuda_available=True, local_rank=1) == torch.device(
        "cuda", 1
    )  # torchrun rank
    assert resolve_device("cuda", cuda_available=True, local_rank=3) == torch.device("cuda", 3)
    assert resolve_device("cuda:2", cuda_available=True, local_rank=3) == torch.device(
        "cuda", 2
    )  # explicit wins
    with pytest.raises(ValueError, match=r"train.device: 'cuda' but CUDA is not available"):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(ValueError, match="only cpu and cuda"):
        resolve_device("meta")
    with pytest.raises(ValueError, match="not a device"):
        resolve_device("gpu0")


def test_config_rejects_an_unknown_device_string():
    with pytest.raises(ConfigError, match="train.device"):
        PropertyConfig.from_dict({"train": {"device": "gpu"}})
    assert PropertyConfig.from_dict({"train": {"device": "cuda:1"}}).train.device == "cuda:1"


@pytest.mark.skipif(CUDA, reason="checks the error on a machine without CUDA")
def test_cli_refuses_cuda_without_a_gpu_in_one_line(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("smiles,y\n" + "".join(f"{s},{0.1 * k}\n" for k, s in enumerate(SMILES)))
    result = CliRunner().invoke(
        app,
        [
            "property",
            "train",
            "--data",
            str(csv),
            "--target-column",
            "y",
            "--out",
            str(tmp_path / "run"),
            "--epochs",
            "1",
            "--device",
            "cuda",
        ],
    )
    assert result.exit_code != 0
    assert "train.device: 'cuda' but CUDA is not available" in result.output
    assert "Traceback" not in result.output


def test_trainer_keeps_model_and_draws_on_its_device(graphs):
    t = trainer(graphs, device="auto")
    assert t.device == resolve_device("auto")
    assert all(p.device.type == t.device.type for p in t.model.parameters())
    assert t.sample_rng.device.type == t.device.type


def test_resume_on_another_device_continues_with_a_new_draw_seed(graphs, tmp_path, caplog):
    """A CUDA generator state cannot be loaded into a CPU generator (and back): the run goes on."""
    trainer(graphs, tmp_path).fit(stop_after=1)
    state = load_checkpoint(tmp_path / "last.pt", kind="training")
    state["rng"]["sample"] = torch.zeros(16, dtype=torch.uint8)  # the size of a CUDA (Philox) state
    save_checkpoint(tmp_path / "last.pt", state)
    resumed = trainer(
        graphs, tmp_path, device="auto"
    )  # the device is not part of the run's identity
    with caplog.at_level("WARNING", logger="mlip_unc"):
        result = resumed.fit(resume=True)
    assert result.epochs_run == 3 and "written on another device" in caplog.text


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["bgnn", "laplace", "mcdropout"])
def test_cuda_training_runs_there_and_starts_where_the_cpu_does(graphs, method, tmp_path):
    """Same seed and config on CPU and GPU: the untrained models validate alike (float32
    round-off); training, the post-hoc fit and the checkpoint work on the GPU, and the saved
    model predicts on the CPU. (Later epochs differ: the posterior draws come from each
    device's own generator.)"""
    cpu, gpu = (
        trainer(graphs, method=method, epochs=2),
        trainer(graphs, method=method, epochs=2, device="cuda"),
    )
    res_cpu, res_gpu = cpu.fit(), gpu.fit()  # the GPU run's post-hoc fit (laplace) runs on the GPU
    assert next(gpu.model.parameters()).is_cuda and res_gpu.finished
    assert res_gpu.initial["val_rmse"] == pytest.approx(res_cpu.initial["val_rmse"], rel=1e-4)
    assert all(torch.isfinite(torch.tensor(r["val_rmse"])) for r in res_gpu.history)
    trainer(graphs, tmp_path, method=method, epochs=2, device="cuda").fit(stop_after=1)
    resumed = trainer(graphs, tmp_path, method=method, epochs=2)  # the GPU run continued on the CPU
    assert resumed.fit(resume=True).epochs_run == 2
