"""Property models: GIN invariances, every method trains and predicts, variance bookkeeping."""

import pytest
import torch
from torch_geometric.data import Batch
from torch_geometric.utils import from_smiles

from mlip_unc import keys
from mlip_unc.config import Method, PropertyConfig
from mlip_unc.data.molecules import TOY_SMILES
from mlip_unc.models.baselines import LaplaceHead
from mlip_unc.models.checkpoint import load_checkpoint, save_checkpoint
from mlip_unc.models.factory import PropertyPredictor, build_model
from mlip_unc.models.property import predict_graphs
from mlip_unc.nn.gin import MolecularGIN
from mlip_unc.train.property import model_payload, property_trainer, target_statistics

SMILES = list(TOY_SMILES)


def tiny_graphs(n=40, seed=0):
    """Graphs of ``from_smiles`` with a synthetic target: heavy atoms, oxygens, aromatic atoms."""
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for k, smi in enumerate(SMILES[:n]):
        g = from_smiles(smi)
        heavy, oxygens, aromatic = g.x.shape[0], int((g.x[:, 0] == 8).sum()), int(g.x[:, 7].sum())
        y = 0.4 * heavy - 0.8 * oxygens + 0.3 * aromatic + 0.05 * torch.randn((), generator=gen)
        g.y = torch.tensor([[float(y)]])
        g.row_id = torch.tensor([k])
        graphs.append(g)
    return graphs


def small_config(method="bgnn", **train):
    model = {
        "method": method,
        "hidden": 16,
        "layers": 2,
        "latent_dim": 8,
        "ensemble_size": 2,
        "mc_samples": 8,
    }
    return PropertyConfig.from_dict(
        {"model": model, "train": {"epochs": 2, "batch_size": 8, "progress": False, **train}}
    )


def _permute(g, perm):
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(len(perm))
    out = g.clone()
    out.x = g.x[perm]
    out.edge_index = inv[g.edge_index]
    return out


def test_gin_permutation_invariance():
    torch.manual_seed(0)
    gin = MolecularGIN(16, 3, 8, dtype=torch.float64).eval()
    g = from_smiles("CC(=O)Nc1ccc(O)cc1")
    perm = torch.randperm(g.num_nodes, generator=torch.Generator().manual_seed(1))
    h = _permute(g, perm)
    z1 = gin(g.x, g.edge_index, edge_attr=g.edge_attr)
    z2 = gin(h.x, h.edge_index, edge_attr=h.edge_attr)
    assert not torch.equal(g.x, h.x)
    torch.testing.assert_close(z1, z2)


@pytest.mark.parametrize("pooling", ["mean", "sum", "max"])
def test_gin_batch_of_two_equals_singles(pooling):
    torch.manual_seed(0)
    gin = MolecularGIN(16, 2, 4, pooling=pooling, norm="layer", dtype=torch.float64).eval()
    a, b = from_smiles("CCO"), from_smiles("c1ccccc1")
    batch = Batch.from_data_list([a, b])
    zb = gin(batch.x, batch.edge_index, edge_attr=batch.edge_attr, batch=batch.batch)
    za = gin(a.x, a.edge_index, edge_attr=a.edge_attr)
    zc = gin(b.x, b.edge_index, edge_attr=b.edge_attr)
    torch.testing.assert_close(zb, torch.cat([za, zc]))


@pytest.mark.parametrize("method", [m.value for m in Method])
def test_each_method_trains_two_epochs_and_predicts(method):
    graphs = tiny_graphs()
    config = small_config(method)
    torch.manual_seed(0)
    mean, std = target_statistics(graphs[:30])
    model = build_model(config, y_mean=mean, y_std=std)
    result = property_trainer(model, config, graphs[:30], graphs[30:35]).fit()
    assert result.epochs_run == 2 and len(result.history) == 2
    out = predict_graphs(model, graphs[35:])
    for key in (keys.PREDICTION, keys.PREDICTION_VAR, keys.EPISTEMIC_VAR, keys.ALEATORIC_VAR):
        assert out[key].shape == (5, 1) and torch.isfinite(out[key]).all()
    assert (out[keys.PREDICTION_VAR] > 0).all() and (out[keys.ALEATORIC_VAR] > 0).all()
    assert (out[keys.EPISTEMIC_VAR] >= 0).all()
    if method != "mve":
        assert (out[keys.EPISTEMIC_VAR] > 0).all(), method
    torch.testing.assert_close(
        out[keys.PREDICTION_VAR], out[keys.EPISTEMIC_VAR] + out[keys.ALEATORIC_VAR]
    )


def test_heteroscedastic_split_and_units():
    graphs = tiny_graphs()
    config = small_config("bgnn").with_overrides(likelihood="heteroscedastic", dtype="float64")
    torch.manual_seed(0)
    model = build_model(config, y_mean=torch.tensor([2.0]), y_std=torch.tensor([3.0])).eval()
    with torch.no_grad():  # make the noise clearly input-dependent
        model.noise.linear.weight.normal_(0.0, 0.5)
    batch = Batch.from_data_list(graphs[:6])
    std_units = model.predictive(batch)
    out = model.predict(batch)
    torch.testing.assert_close(
        out[keys.PREDICTION_VAR], out[keys.EPISTEMIC_VAR] + out[keys.ALEATORIC_VAR]
    )
    torch.testing.assert_close(out[keys.PREDICTION], std_units[keys.PREDICTION] * 3.0 + 2.0)
    torch.testing.assert_close(out[keys.EPISTEMIC_VAR], std_units[keys.EPISTEMIC_VAR] * 9.0)
    torch.testing.assert_close(out[keys.ALEATORIC_VAR], std_units[keys.ALEATORIC_VAR] * 9.0)
    assert out[keys.ALEATORIC_VAR].std() > 0  # heteroscedastic: differs between molecules
    # the closed-form epistemic variance of the Bayesian last layer: z^T S z + s_b^2
    z, head = std_units[keys.LATENT], model.head
    expected = (z * z) @ head.weight_var.T + head.bias_std**2
    torch.testing.assert_close(std_units[keys.EPISTEMIC_VAR], expected)


def test_laplace_head_closed_form():
    torch.manual_seed(0)
    head = LaplaceHead(3, 1, dtype=torch.float64)
    z = torch.randn(50, 3, dtype=torch.float64)
    noise = torch.full((50, 1), 0.25, dtype=torch.float64)
    head.fit(z, noise)
    lam = float(head.prior_precision[0])
    zt = torch.cat([z, torch.ones(50, 1, dtype=torch.float64)], 1)
    cov = torch.linalg.inv(lam * torch.eye(4, dtype=torch.float64) + zt.T @ zt / 0.25)
    torch.testing.assert_close(head.posterior_cov[0], cov)
    _, var = head.predictive(z[:5])
    torch.testing.assert_close(var[:, 0], torch.einsum("np,pq,nq->n", zt[:5], cov, zt[:5]))
    # lambda maximises the Laplace marginal likelihood (checked against neighbours on a fine grid)
    theta = torch.cat([head.linear.weight[0], head.linear.bias]).detach()
    evals = torch.linalg.eigvalsh(zt.T @ zt / 0.25)

    def logml(l):
        return -0.5 * (torch.log(l + evals).sum() - 4 * torch.log(l) + l * theta @ theta)

    best = logml(torch.tensor(lam, dtype=torch.float64))
    for factor in (0.8, 1.25):
        assert best >= logml(torch.tensor(lam * factor, dtype=torch.float64))


def test_mc_predictions_are_reproducible_and_leave_global_rng_alone():
    graphs = tiny_graphs()
    for method in ("mcdropout", "fullbnn"):
        config = small_config(method)
        torch.manual_seed(0)
        model = build_model(config).eval()
        state = torch.get_rng_state()
        a = predict_graphs(model, graphs[:5])
        b = predict_graphs(model, graphs[:5])
        assert torch.equal(torch.get_rng_state(), state)
        torch.testing.assert_close(a[keys.EPISTEMIC_VAR], b[keys.EPISTEMIC_VAR])


def test_ensemble_mixture_moments():
    graphs = tiny_graphs()
    torch.manual_seed(0)
    model = build_model(small_config("ensemble")).eval()
    batch = Batch.from_data_list(graphs[:4])
    out = model.predictive(batch)
    means = torch.stack([m.predictive(batch)[keys.PREDICTION] for m in model.members])
    torch.testing.assert_close(out[keys.PREDICTION], means.mean(0))
    torch.testing.assert_close(out[keys.EPISTEMIC_VAR], means.var(0, unbiased=False))


def test_saved_model_reloads_with_weights_only(tmp_path):
    graphs = tiny_graphs()
    for method in ("bgnn", "laplace", "ensemble"):
        config = small_config(method)
        torch.manual_seed(0)
        model = build_model(config, y_mean=torch.tensor([1.0]), y_std=torch.tensor([2.0]))
        property_trainer(model, config, graphs[:30], graphs[30:]).fit()
        path = save_checkpoint(
            tmp_path / f"{method}.pt", model_payload(model, config, {"n_targets": 1})
        )
        raw = torch.load(path, weights_only=True)
        assert raw["normalization"] == {"mean": [1.0], "std": [2.0]}
        assert load_checkpoint(path, kind="property")["config"]["model"]["method"] == method
        loaded = PropertyPredictor.load(path).predict(graphs[:5])
        direct = PropertyPredictor(model.eval(), config).predict(graphs[:5])
        for key in ("mean", "std", "epistemic_std", "aleatoric_std"):
            assert loaded[key].shape == (5, 1)
            torch.testing.assert_close(torch.as_tensor(loaded[key]), torch.as_tensor(direct[key]))


def test_mc_dropout_draws_equal_those_of_a_seeded_global_rng():
    """The locally forked RNG gives the numbers of ``torch.manual_seed(seed)`` + dropout draws."""
    graphs = tiny_graphs()
    torch.manual_seed(0)
    model = build_model(small_config("mcdropout")).eval()
    batch = Batch.from_data_list(graphs[:6])
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts

    def reference(seed):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for m in dropouts:
                m.train()
            draws = torch.stack([model.head(model.latent(batch)) for _ in range(model.mc_samples)])
            for m in dropouts:
                m.eval()
        return draws.mean(0), draws.var(0, unbiased=True)

    out = model.predictive(batch)
    mean, epi = reference(0)
    assert torch.equal(out[keys.PREDICTION], mean) and torch.equal(out[keys.EPISTEMIC_VAR], epi)
    gen = torch.Generator().manual_seed(5)
    seed = int(torch.randint(0, 2**31 - 1, (), generator=torch.Generator().manual_seed(5)))
    out = model.predictive(batch, generator=gen)
    mean, epi = reference(seed)
    assert torch.equal(out[keys.PREDICTION], mean) and torch.equal(out[keys.EPISTEMIC_VAR], epi)
    assert not any(m.training for m in dropouts)
