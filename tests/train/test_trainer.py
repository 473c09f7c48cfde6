"""The property trainer: KL scaling, resume determinism, history, regulariser hook, configs."""

import json

import pytest
import torch
from torch_geometric.utils import from_smiles

from mlip_unc.config import PropertyConfig
from mlip_unc.config import PropertyTrainConfig as TrainConfig
from mlip_unc.config import load_property_config as load_config
from mlip_unc.data.molecules import TOY_SMILES
from mlip_unc.models.checkpoint import CheckpointError, save_checkpoint
from mlip_unc.models.factory import build_model
from mlip_unc.train import property as property_module
from mlip_unc.train.losses import gaussian_nll, kl_weight, negative_elbo
from mlip_unc.train.property import (
    model_payload,
    property_trainer,
    target_statistics,
    train_property_model,
)
from mlip_unc.train.regularizers import EPS, regularizer_term

SMILES = list(TOY_SMILES)


@pytest.fixture(scope="module")
def graphs():
    out = []
    for k, smi in enumerate(SMILES):
        g = from_smiles(smi)
        y = 0.4 * g.x.shape[0] - 0.8 * int((g.x[:, 0] == 8).sum()) + 0.1 * ((k * 7) % 5)
        g.y = torch.tensor([[float(y)]])
        g.row_id = torch.tensor([k])
        out.append(g)
    return out


def config(method="bgnn", **train):
    model = {"method": method, "hidden": 16, "layers": 2, "latent_dim": 8, "mc_samples": 4}
    base = {"epochs": 6, "batch_size": 8, "progress": False, "patience": 0}
    return PropertyConfig.from_dict({"model": model, "train": {**base, **train}})


def fresh(cfg, graphs, out_dir=None):
    torch.manual_seed(cfg.train.seed)
    mean, std = target_statistics(graphs[:32])
    model = build_model(cfg, y_mean=mean, y_std=std)
    return property_trainer(model, cfg, graphs[:32], graphs[32:], out_dir=out_dir)


# ---------------------------------------------------------------------- ELBO
def test_negative_elbo_scales_kl_by_n_train():
    nll, kl = torch.tensor(0.7), torch.tensor(50.0)
    loss, term = negative_elbo(nll, kl, n_train=200, beta=0.5)
    assert term.item() == pytest.approx(0.5 * 50.0 / 200) and loss.item() == pytest.approx(
        0.7 + 0.125
    )
    # one convention: a linear ramp from 0 over the (fractional) epochs, evaluated every step
    assert (
        kl_weight(0, beta=1.0, warmup_epochs=4) == 0.0
        and kl_weight(1, beta=1.0, warmup_epochs=4) == 0.25
    )
    assert kl_weight(9, beta=2.0, warmup_epochs=4) == 2.0 and kl_weight(0.5, beta=1.0) == 1.0
    with pytest.raises(ValueError):
        negative_elbo(nll, kl, n_train=0)


def test_gaussian_nll_ignores_missing_targets():
    mean, var = torch.zeros(3, 1), torch.ones(3, 1)
    full = gaussian_nll(mean[:2], var[:2], torch.tensor([[1.0], [0.0]]))
    masked = gaussian_nll(mean, var, torch.tensor([[1.0], [0.0], [float("nan")]]))
    assert masked.item() == pytest.approx(full.item())


def test_trainer_kl_term_is_beta_kl_over_training_examples(graphs):
    """Logged KL term = beta * KL / N_train (N_train = 32 examples, not 4 batches)."""
    cfg = config(epochs=1, beta=0.3, lr=1e-12, batch_size=8)
    trainer = fresh(cfg, graphs)
    kl_before = trainer.model.kl().item()
    trainer.fit()
    record = trainer.history[0]
    assert record["train_kl"] == pytest.approx(0.3 * kl_before / 32, rel=1e-5)
    assert record["kl_total"] == pytest.approx(kl_before, rel=1e-5)


# ---------------------------------------------------------------------- resume
def _final(trainer):
    return trainer.history[-1]["val_nll"], trainer.history[-1]["train_nll"]


def test_resume_after_interruption_matches_uninterrupted_run(graphs, tmp_path):
    # weight sampling (noise generator), plateau schedule and early stopping state all resume
    cfg = config("fullbnn", epochs=12, patience=3, stop_metric="rmse", lr=0.01)  # stops early at 10
    full = fresh(cfg, graphs, tmp_path / "a")
    res_a = full.fit()

    part = fresh(cfg, graphs, tmp_path / "b")
    res_b1 = part.fit(stop_after=8)
    assert not res_b1.finished and res_b1.epochs_run == 8
    resumed = fresh(cfg, graphs, tmp_path / "b")  # a new process: new model, then load
    res_b = resumed.fit(resume=True)
    assert res_b.finished and res_b.epochs_run == res_a.epochs_run
    assert (res_b.best_epoch, res_b.stopped_early) == (res_a.best_epoch, res_a.stopped_early)
    assert res_a.stopped_early and res_a.epochs_run < cfg.train.epochs
    assert len(resumed.history) == res_a.epochs_run
    assert _final(resumed) == pytest.approx(_final(full), rel=1e-6, abs=1e-7)
    hist = json.loads((tmp_path / "b" / "history.json").read_text())["epochs"]
    assert [r["epoch"] for r in hist] == list(range(1, res_a.epochs_run + 1))
    for key, value in full.model.state_dict().items():  # the restored best weights agree
        torch.testing.assert_close(resumed.model.state_dict()[key], value, rtol=1e-5, atol=1e-6)


def test_resume_after_a_crash_in_a_callback(graphs, tmp_path):
    cfg = config(
        "mcdropout", epochs=5, lr_schedule="cosine"
    )  # dropout draws from torch's global RNG
    full = fresh(cfg, graphs, tmp_path / "a")
    full.fit()

    def crash(epoch, record):
        if epoch == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fresh(cfg, graphs, tmp_path / "b").fit(callbacks=[crash])
    resumed = fresh(cfg, graphs, tmp_path / "b")
    resumed.fit(resume=True)
    assert resumed.epoch == full.epoch == 5
    assert _final(resumed) == pytest.approx(_final(full), rel=1e-6, abs=1e-7)


def test_resume_refuses_damaged_or_foreign_checkpoints(graphs, tmp_path):
    cfg = config(epochs=2)
    fresh(cfg, graphs, tmp_path).fit(stop_after=1)
    other = fresh(config(epochs=2, lr=0.5), graphs, tmp_path)
    with pytest.raises(CheckpointError, match="different config"):
        other.fit(resume=True)
    ckpt = tmp_path / "last.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        fresh(cfg, graphs, tmp_path).fit(resume=True)


# ---------------------------------------------------------------------- history, hook
def test_history_and_regulariser_hook(graphs, tmp_path, monkeypatch):
    calls = []

    def spy(kind, z, mu, s2):  # the real term, with the latents and head it was given
        calls.append((z.detach().double(), mu.detach().double(), s2.detach().double()))
        return regularizer_term(kind, z, mu, s2)

    monkeypatch.setattr(property_module, "regularizer_term", spy)
    cfg = config("agl", epochs=3, reg_lambda=0.5, reg_warmup=1, reg_ramp=1)
    assert cfg.train.regularizer == "agl_mean"
    trainer = fresh(cfg, graphs, tmp_path)
    trainer.fit()
    hist = json.loads((tmp_path / "history.json").read_text())["epochs"]
    for key in (
        "train_nll",
        "train_kl",
        "train_reg",
        "val_rmse",
        "val_nll",
        "train_lambda",
        "effective_rank",
        "mean_s",
    ):
        assert key in hist[0], key
    # lambda per step: 0 in the warm-up epoch, a ramp within the second, lambda_max in the third
    lam = [r["train_lambda"] for r in hist]
    assert lam[0] == 0.0 and 0.0 < lam[1] < 0.5 and lam[2] == 0.5
    # the term runs where lambda > 0: 3 of the second epoch's 4 batches of 8, all 4 of the third
    assert len(calls) == 7 and all(z.shape[0] == 8 for z, _, _ in calls)
    # AGL mean form: mean over the batch of 1 - (mu.z)^2 / ((z^T S z)(mu^T S^-1 mu) + eps)
    terms = [
        float((1 - (z @ mu) ** 2 / ((z.square() @ s2) * (mu.square() / s2).sum() + EPS)).mean())
        for z, mu, s2 in calls
    ]
    assert min(terms) > 1e-3  # not trivially 0
    # logged: the unweighted term, averaged over the epoch's 32 graphs (0 in lambda = 0 batches)
    assert hist[0]["train_reg"] == 0.0
    assert hist[1]["train_reg"] == pytest.approx(sum(terms[:3]) * 8 / 32, rel=1e-6)
    assert hist[2]["train_reg"] == pytest.approx(sum(terms[3:]) * 8 / 32, rel=1e-6)


@pytest.mark.parametrize("intervention", ["isotropy", "anti", "rotation"])
def test_interventions(graphs, intervention):
    cfg = config(epochs=1, intervention=intervention, reg_warmup=0, reg_ramp=0)
    trainer = fresh(cfg, graphs)
    trainer.fit()
    if intervention == "rotation":
        assert trainer.model.rotation is not None and trainer.history[0]["train_reg"] == 0.0
    else:
        assert trainer.task.reg_kind == intervention and trainer.history[0]["train_reg"] != 0.0


def test_freeze_posterior_from_baseline(graphs, tmp_path):
    base = config(epochs=1)
    torch.manual_seed(5)
    donor = build_model(base)
    save_checkpoint(tmp_path / "base.pt", model_payload(donor, base, {"n_targets": 1}))
    cfg = config(epochs=2, intervention="isotropy", reg_warmup=0)
    _, metrics = train_property_model(
        cfg,
        graphs[:30],
        graphs[30:35],
        graphs[35:],
        out_dir=tmp_path / "run",
        freeze_posterior=tmp_path / "base.pt",
    )
    from mlip_unc.models.factory import PropertyPredictor

    head = PropertyPredictor.load(tmp_path / "run").model.head
    torch.testing.assert_close(head.weight_mu, donor.head.weight_mu)
    torch.testing.assert_close(head.weight_rho, donor.head.weight_rho)
    assert metrics["rmse"] > 0


def test_laplace_posterior_is_fitted_after_training(graphs, tmp_path):
    """After training, the last-layer Laplace posterior is the closed form on the TRAINING latents:
    Sigma = (Z~^T Z~ / sigma_n^2 + lambda I)^-1, Z~ = [Z, 1], recomputed here from the model."""
    from torch_geometric.data import Batch

    from mlip_unc import keys

    predictor, _ = train_property_model(
        config("laplace", epochs=2), graphs[:32], graphs[32:], out_dir=tmp_path
    )
    model, head = predictor.model.eval(), predictor.model.head
    assert bool(head.fitted)
    with torch.no_grad():
        z = model.latent(Batch.from_data_list(graphs[:32]))  # (32, d)
        noise_var = model.noise(z).double()  # (32, 1) in standardised units
        out = model.predictive(Batch.from_data_list(graphs[32:]))
    zt = torch.cat([z.double(), torch.ones(32, 1, dtype=torch.float64)], 1)  # (32, p)
    p = zt.shape[1]
    lam = head.prior_precision[0].double()
    precision = zt.T @ (zt / noise_var) + lam * torch.eye(p, dtype=torch.float64)  # (p, p)
    cov = torch.linalg.inv(precision)
    torch.testing.assert_close(
        head.posterior_cov[0].double(), cov, rtol=1e-4, atol=1e-6 * cov.abs().max().item()
    )
    # lambda maximises the Laplace evidence -1/2 [log det(lambda I + H) - p log lambda + lambda |theta|^2]
    theta = torch.cat([head.linear.weight[0], head.linear.bias]).detach().double()
    hess = precision - lam * torch.eye(p, dtype=torch.float64)

    def log_evidence(value):
        eye = torch.eye(p, dtype=torch.float64)
        return -0.5 * (torch.logdet(hess + value * eye) - p * value.log() + value * theta @ theta)

    assert all(log_evidence(lam) >= log_evidence(lam * f) for f in (0.5, 2.0))
    # the predictive epistemic variance of held-out graphs uses that covariance: z~^T Sigma z~
    zt_val = torch.cat(
        [out[keys.LATENT].double(), torch.ones(len(graphs) - 32, 1, dtype=torch.float64)], 1
    )
    expected = torch.einsum("np,pq,nq->n", zt_val, cov, zt_val)
    torch.testing.assert_close(
        out[keys.EPISTEMIC_VAR][:, 0].double(), expected, rtol=1e-3, atol=1e-7
    )


# ---------------------------------------------------------------------- config
def test_config_round_trip_and_validation(tmp_path):
    cfg = PropertyConfig().with_overrides(method="mcdropout", epochs=7, intervention="rotation")
    assert cfg.model.dropout == 0.1 and cfg.train.reg_warmup == 1
    again = PropertyConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    (tmp_path / "c.yaml").write_text("model:\n  method: mve\ntrain:\n  epochs: 3\n")
    loaded = load_config(tmp_path / "c.yaml")
    assert loaded.model.likelihood.value == "heteroscedastic" and loaded.train.epochs == 3
    assert loaded.with_overrides(method="bgnn").model.likelihood.value == "heteroscedastic"
    assert loaded.with_overrides(method="agl").model.likelihood.value == "homoscedastic"
    with pytest.raises(ValueError, match="unknown"):
        PropertyConfig.from_dict({"train": {"epochz": 3}})
    with pytest.raises(ValueError):
        TrainConfig(calibration="platt")
    with pytest.raises(ValueError, match="Bayesian last layer"):
        PropertyConfig().with_overrides(method="mve", regularizer="agl_mean")


class _NoIteration(list):
    """A sequence that may be indexed but not iterated or copied whole (as an on-disk set)."""

    def __iter__(self):
        raise AssertionError("the training core iterated the whole training set")


def test_the_core_indexes_a_sequence_of_training_data_without_copying_it(graphs):
    cfg = config(epochs=2)
    trainer = fresh(cfg, graphs)
    trainer.task.train_graphs = _NoIteration(graphs[:32])
    trainer.fit()  # iterating (list(data)) would raise; DataLoader indexes the sequence
    assert trainer.epoch == 2


class _PhasedTask:
    """A scripted task: validation reports (metric, phase) from a list: the initial one, then one per epoch."""

    metric_key = "valid_loss"

    def __init__(self, script):
        self.model = torch.nn.Linear(1, 1)
        self.script, self.calls, self.progress = list(script), 0, []

    def train_data(self):
        return [torch.ones(1)] * 2

    def loss(self, batch, step):
        self.progress.append(step.progress)
        return (self.model(batch.reshape(-1, 1)) ** 2).mean(), {}

    def validate(self):
        metric, phase = self.script[self.calls]
        self.calls += 1
        return {"valid_loss": metric, "phase": phase}

    def signature(self):
        return {}


def test_a_new_phase_restarts_the_best_model():
    """The stage-one epoch 2 has the lowest metric, but the phase-1 epochs are another loss:
    the best model is the best of the last phase (epoch 4), not epoch 2."""
    from mlip_unc.config.training import TrainCoreConfig
    from mlip_unc.train.core import Trainer

    task = _PhasedTask([(10.0, 0), (5.0, 0), (1.0, 0), (9.0, 1), (3.0, 1), (4.0, 1)])
    opts = TrainCoreConfig(epochs=5, batch_size=1, progress=False, lr_schedule="cosine")
    result = Trainer(task, opts, seed=0).fit()
    assert result.best_epoch == 4 and result.best_metric == 3.0
    assert task.progress == pytest.approx(
        [k / 10 for k in range(10)]
    )  # epoch + batch / n over 5 epochs
    without = Trainer(
        _PhasedTask([(10.0, 0), (5.0, 0), (1.0, 0), (9.0, 0), (3.0, 0), (4.0, 0)]), opts, seed=0
    ).fit()
    assert without.best_epoch == 2
