"""Every option of the package as a ``str`` Enum with a docstring per member.

Configs (``mlip_unc.config``) validate against these; the layers that implement an option
(``nn``, ``models``, ``train``) import the Enum from here, so the names live in one place.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported lazily (configs load without it)
    import torch

__all__ = [
    "DType",
    "Estimator",
    "Likelihood",
    "Pooling",
    "Norm",
    "Method",
    "LRSchedule",
    "ScheduleClock",
    "StopMetric",
    "Intervention",
    "AGLForm",
    "RegularizerKind",
    "Calibration",
    "SplitKind",
    "Backbone",
    "HeadKind",
    "PosteriorBasis",
    "PosteriorKind",
    "ReferenceEnergies",
    "UncertaintyMode",
    "ForceUncertaintyMode",
    "MDEnsemble",
    "MDBias",
]


class DType(str, Enum):
    """Floating-point precision of model and data."""

    FLOAT32 = "float32"
    """Single precision (faster)."""
    FLOAT64 = "float64"
    """Double precision (exact force/energy consistency)."""

    @property
    def torch(self) -> torch.dtype:
        import torch

        return torch.float32 if self is DType.FLOAT32 else torch.float64


class Estimator(str, Enum):
    """How a training-time forward pass draws from the weight posterior."""

    LOCAL = "local"
    """Local reparameterisation: sample the pre-activation y ~ N(mu^T z, z^T S z) per example."""
    FLIPOUT = "flipout"
    """Flipout: one weight perturbation per batch, made per-example by random sign flips."""


class Likelihood(str, Enum):
    """The Gaussian noise model."""

    HOMOSCEDASTIC = "homoscedastic"
    """One learned noise std per target, sigma_n = softplus(rho) + min_std."""
    HETEROSCEDASTIC = "heteroscedastic"
    """A second (deterministic) output of z through softplus: sigma_n(z) = softplus(a^T z + c) + min_std."""


class Pooling(str, Enum):
    """How atom features become one graph feature."""

    MEAN = "mean"
    """Average over atoms (size-independent)."""
    SUM = "sum"
    """Sum over atoms (extensive properties)."""
    MAX = "max"
    """Element-wise maximum over atoms."""


class Norm(str, Enum):
    """Normalisation after each GINE layer."""

    BATCH = "batch"
    """Batch norm over the atoms of the batch (running statistics at evaluation)."""
    LAYER = "layer"
    """Layer norm per graph."""
    NONE = "none"
    """No normalisation."""


class Method(str, Enum):
    """Uncertainty method of the property model (all share the GIN backbone and the trainer)."""

    BGNN = "bgnn"
    """GIN + mean-field Bayesian last layer, closed-form predictive (docs/method.md section 2)."""
    AGL = "agl"
    """BGNN trained with the alignment-guided learning term (docs/method.md section 6)."""
    FULLBNN = "fullbnn"
    """GIN + a head whose every dense layer is Bayesian; Monte Carlo predictive."""
    MCDROPOUT = "mcdropout"
    """Deterministic head, dropout kept on at prediction; Monte Carlo over dropout masks."""
    ENSEMBLE = "ensemble"
    """Deep ensemble of M independently initialised deterministic models (mixture moments)."""
    MVE = "mve"
    """Mean-variance estimation: deterministic mean and heteroscedastic noise, no epistemic part."""
    LAPLACE = "laplace"
    """MAP training, then the closed-form Gaussian last-layer Laplace posterior."""


class LRSchedule(str, Enum):
    """Learning-rate schedule of the training core (``mlip_unc.train.core``)."""

    CONSTANT = "constant"
    """Keep ``train.lr``."""
    PLATEAU = "plateau"
    """Multiply by ``train.lr_factor`` after ``train.lr_patience`` epochs without a better
    validation metric."""
    COSINE = "cosine"
    """Cosine decay from ``train.lr`` to ``train.min_lr``, set every step from the training
    progress (``train.schedule_clock`` says what it counts)."""


class ScheduleClock(str, Enum):
    """What the training progress counts: the clock of the cosine schedule and of the loss's
    stage two (``loss.stage_two_start``)."""

    EPOCHS = "epochs"
    """Epoch / ``train.epochs`` (fractional within an epoch). The schedule does not depend on
    the machine's speed or load: the same config and seed train the same model;
    ``train.max_minutes`` only stops the run."""
    WALL = "wall"
    """The larger of epoch / ``train.epochs`` and elapsed / ``train.max_minutes``, so a run
    stopped by its wall-time budget still ends its schedule at ``train.min_lr``: for
    comparisons at equal wall time. Not reproducible: the model depends on machine load."""


class StopMetric(str, Enum):
    """Validation metric of a property model for early stopping, best model and plateau."""

    NLL = "nll"
    """Gaussian negative log-likelihood of the validation targets."""
    RMSE = "rmse"
    """Root-mean-square error of the predictive mean."""


class Intervention(str, Enum):
    """LPA-breaking interventions (docs/method.md section 5)."""

    ISOTROPY = "isotropy"
    """Penalise the spread of per-coordinate second moments of z (regulariser ``isotropy``)."""
    ANTI = "anti"
    """Anti-alignment term (regulariser ``anti``)."""
    ROTATION = "rotation"
    """Feed Q z with a fixed random orthogonal Q to the head."""


class AGLForm(str, Enum):
    """Form of the AGL term (docs/method.md section 6)."""

    MEAN = "mean"
    """mean_batch(1 - A(z)); the default (largest effect in the method.md scratch table)."""
    RAYLEIGH = "rayleigh"
    """mean_batch(z^T S z / z^T z)."""


class RegularizerKind(str, Enum):
    """Extra latent training terms (docs/method.md sections 5 and 6 of this project)."""

    NONE = "none"
    """No extra term (returns a zero scalar)."""
    AGL_RAYLEIGH = "agl_rayleigh"
    """AGL, Rayleigh form: ``mean_batch(z^T sg(S) z / (z^T z + eps))``; promotes LPA."""
    AGL_MEAN = "agl_mean"
    """AGL, mean form: ``mean_batch(1 - A(z))`` with ``mu`` and ``S`` detached; promotes LPA."""
    ISOTROPY = "isotropy"
    """Intervention: spread of the per-coordinate second moments of z (forces kappa -> 1)."""
    ANTI = "anti"
    """Intervention: anti-alignment ``-mean_batch(z^T sg(S) z / ||z||^2)``."""
    DECORRELATION = "decorrelation"
    """Optional AGL companion: ``||offdiag(Cov_batch(z))||_F^2``."""


class Calibration(str, Enum):
    """Post-hoc recalibration of predictive stds, fitted on the validation split."""

    NONE = "none"
    """Raw predictive stds."""
    ZSCALING = "zscaling"
    """One scale factor s: std -> s * std, s^2 = mean(z^2) of the validation z-scores."""
    ISOTONIC = "isotonic"
    """Isotonic regression of observed on expected quantile coverage (Kuleshov et al. 2018)."""


class SplitKind(str, Enum):
    """How a molecular dataset is split 80/10/10 into training, validation and test rows."""

    RANDOM = "random"
    """A seeded random permutation of the rows."""
    SCAFFOLD = "scaffold"
    """Bemis-Murcko scaffolds, each wholly on one side: a harder test of generalisation."""


class Backbone(str, Enum):
    """Feature extractor producing the per-atom latents z_a of a potential."""

    GIN = "gin"
    """Geometric GIN (invariant; distances only), ``mlip_unc.nn.geometric_gin``."""
    EQUIVARIANT = "equivariant"
    """E(3)-equivariant e3nn network with invariant output latents, ``mlip_unc.nn.equivariant``."""
    MACE = "mace"
    """MACE (mace-torch's interaction and product blocks) with this project's readout,
    ``mlip_unc.nn.mace_backbone``; needs ``pip install mlip-unc[mace]``."""


class HeadKind(str, Enum):
    """How the energy head of a potential is trained."""

    BAYESIAN = "bayesian"
    """Mean-field Gaussian head, Bayes-by-Backprop: one weight draw per batch, + beta KL / N."""
    MAP = "map"
    """Posterior mean only (no sampling, no KL): a deterministic model, e.g. a committee member."""


class PosteriorKind(str, Enum):
    """The energy head's posterior used for uncertainties after training (docs/method.md s.3b)."""

    FULL = "full"
    """Full-covariance last-layer posterior (prediction rigidity: energy features and force
    Jacobian rows of the training set), calibrated on validation data by NLL."""
    DIAGONAL = "diagonal"
    """The mean-field posterior of Bayes-by-Backprop, as trained."""


class PosteriorBasis(str, Enum):
    """The weight space of the full posterior (docs/method.md s.3b, :mod:`mlip_unc.models.full_posterior`)."""

    SHARED = "shared"
    """The head's own ``d`` weights: features ``Phi = sum_atoms z``."""
    PER_ELEMENT = "per_element"
    """One weight vector per element (``n_types * d``): features ``Phi_e = sum_{atoms of element e} z``,
    the same posterior mean (the head's weights, repeated), so the same predictions."""


class EnergyCount(str, Enum):
    """How often a structure's energy enters the potential loss (``mlip_unc.train.losses``)."""

    AUTO = "auto"
    """``atom`` when a training structure is periodic or the sizes spread more than twofold,
    ``structure`` otherwise (``mlip_unc.train.potential.energy_per_atom``)."""
    STRUCTURE = "structure"
    """Once per structure: the plain likelihood of its total energy (per-atom normalised)."""
    ATOM = "atom"
    """Once per atom (n_atoms x the per-atom energy NLL, whose variance is sigma_e^2 / n_atoms):
    a structure's squared per-atom residual weighs n_atoms^2 / sigma_e^2, against its 3 n_atoms
    force terms (``structure``: n_atoms / sigma_e^2)."""


class ReferenceEnergies(str, Enum):
    """Where the per-element energy offsets E0(Z) come from."""

    AUTO = "auto"
    """Isolated-atom frames where available (``data.isolated_atoms`` or one-atom training
    frames), least squares on the training energies for the remaining elements."""
    ISOLATED = "isolated"
    """Isolated-atom frames only; an element without one is an error."""
    LEAST_SQUARES = "least_squares"
    """Least squares of training energies on element counts (isolated frames ignored)."""
    ZERO = "zero"
    """No offsets."""


class UncertaintyMode(str, Enum):
    """Which uncertainties :meth:`BayesianPotential.forward` adds to the mean predictions."""

    NONE = "none"
    """Means only (energy, per-atom energies, forces/stress when asked)."""
    ENERGY = "energy"
    """Closed-form energy variances from the forward pass alone (no extra backward):
    total, epistemic ``Phi^T S Phi``, aleatoric ``n_atoms sigma_e^2``, per-atom ``z^T S z``,
    and the alignment factor kappa."""
    SAMPLED = "sampled"
    """ENERGY plus force (and stress) variances from ``n_samples`` posterior weight draws that
    share the single forward pass: one vector-Jacobian product per draw (plus one for the
    mean forces), unbiased sample variance."""
    EXACT = "exact"
    """ENERGY plus exact force (and stress) variances ``sum_k s_k^2 (dPhi_k/dr)^2``:
    d vector-Jacobian products (one per latent coordinate; the mean forces come free),
    serving every graph of the batch. With a full posterior: ``J^T Sigma J`` (d + 1 products)."""
    LOWRANK = "lowrank"
    """ENERGY plus force (and stress) variances from the ``posterior_rank`` least constrained
    posterior directions only (``rank + 1`` vector-Jacobian products): the leading rows of the
    full posterior's factor, or the largest-variance axes of a diagonal one."""
    SKETCH = "sketch"
    """ENERGY plus the LOWRANK variances estimated from one fixed +-1 combination of those
    ``r`` directions (2 vector-Jacobian products at any rank): unbiased over the signs, noisier
    per atom, for structures where ``r + 1`` backward passes cost too much."""
    AUTO = "auto"
    """LOWRANK while the largest structure of the batch has at most
    ``LOWRANK_ATOM_DIRECTIONS / r`` atoms, else SKETCH: force uncertainty within 2x the cost
    of energy + forces at every size (the default with a full posterior)."""


class ForceUncertaintyMode(str, Enum):
    """The :class:`UncertaintyMode` members with force (and stress) variances: the modes of the
    calculator's force uncertainty (``mlip-unc md/flag --uncertainty``, ``uncertainty`` of an
    active-learning config)."""

    EXACT = "exact"
    """:attr:`UncertaintyMode.EXACT`."""
    SAMPLED = "sampled"
    """:attr:`UncertaintyMode.SAMPLED`."""
    LOWRANK = "lowrank"
    """:attr:`UncertaintyMode.LOWRANK`."""
    SKETCH = "sketch"
    """:attr:`UncertaintyMode.SKETCH`."""
    AUTO = "auto"
    """:attr:`UncertaintyMode.AUTO`."""


class MDEnsemble(str, Enum):
    """Thermodynamic ensemble of uncertainty-monitored MD (``mlip-unc md --ensemble``,
    ``md.ensemble`` of an active-learning config)."""

    NVE = "nve"
    """Velocity Verlet, constant energy."""
    LANGEVIN = "langevin"
    """Langevin thermostat, constant temperature (NVT)."""


class MDBias(str, Enum):
    """Uncertainty-driven exploration of MD (``mlip_unc.active.biased_md``; ``--bias``,
    ``md.bias``)."""

    NONE = "none"
    """Plain MD on the model's energy."""
    VARIANCE = "variance"
    """``E_bias = -k s2`` of the epistemic energy variance ``s2`` (unbounded below)."""
    UDD = "udd"
    """Uncertainty-driven dynamics (Kulichenko et al., Nat. Comput. Sci. 3, 230 (2023)):
    ``E_bias = A [exp(-s2 / (N B^2)) - 1]``, bounded."""
