"""What a training run is told and what it reports: the configurations and results of the
node-level loop (:mod:`refimpl.train.loop`) and of the graph-level one
(:mod:`refimpl.train.graph_level`).

Every field is checked when the configuration is made, in one line naming it, not when
training meets it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from refimpl.fields import (
    check_bool,
    check_choice,
    check_nonnegative_int,
    check_nonnegative_number,
    check_positive_int,
)
from refimpl.init import INITIALISERS
from refimpl.ops.losses import BCEWithLogits, L1Loss, MSELoss
from refimpl.optim import OPTIMIZERS
from refimpl.schedules import check_schedule

__all__ = [
    "LOSSES",
    "PE_KINDS",
    "GraphRunResult",
    "GraphTrainConfig",
    "RunResult",
    "TrainConfig",
]

LOSSES = {"l1": L1Loss, "mse": MSELoss, "bce": BCEWithLogits}
PE_KINDS = ("laplacian", "random-walk", "learned-laplacian")


@dataclass(frozen=True)
class TrainConfig:
    """How to train a node classifier; the model and the data are passed separately.

    Parameters
    ----------
    epochs : int, default 200
        Positive: epochs to train (fewer if ``loss_threshold`` stops the run).
    optimizer : str, default "adam"
        ``"adam"`` (PyTorch's semantics) or ``"sgd"`` (plain gradient descent), any case.
    lr : float, default 0.005
        Positive learning rate (the GAT paper's, on Cora); a ``schedule`` starts from it.
    weight_decay : float, default 0.0
        ``>= 0``: L2 penalty added to the gradient (both papers' experiments).
    loss_threshold : float or None, default None
        ``>= 0``: stop once the training loss is below it (GAT-balance stops at 1e-4);
        ``None``: train every epoch.
    checkpoint_every : int, default 0
        ``>= 0``: epochs between checkpoints in the run folder; 0: none.
    seed : int, default 0
        ``>= 0``: parameters from ``default_rng([seed, 0])``, dropout and batches from
        ``default_rng([seed, 1])``.
    init : str, default "xavier"
        The model's initialisation scheme, a name of :data:`refimpl.init.INITIALISERS`
        (``"xavier"``, ``"Bal_O"``, ...).
    diagnostics : bool, default False
        Log GAT-balance's balancedness and conservation residual each epoch, and write the
        initial and best parameters and the fraction of them that changed.
    batch_size : int or None, default None
        Positive: nodes per batch (random node partitions each epoch, NodeFormer Sec. 4.2);
        ``None``: full batch.
    batch_nodes : str, default "all"
        Batches of ``"all"`` nodes or of the ``"train"`` nodes only (NodeFormer's
        ``main-batch.py``; needs ``batch_size``).
    schedule : MultiStepLR, ReduceLROnPlateau or None, default None
        A learning-rate schedule (:mod:`refimpl.schedules`); ``None``: a constant rate.
    schedule_every : str, default "epoch"
        Step the schedule once per ``"epoch"`` or per ``"batch"`` (optimiser step;
        not ``ReduceLROnPlateau``, which watches the validation split).
    """

    epochs: int = 200
    optimizer: str = "adam"
    lr: float = 0.005
    weight_decay: float = 0.0
    loss_threshold: float | None = None
    checkpoint_every: int = 0
    seed: int = 0
    init: str = "xavier"
    diagnostics: bool = False
    batch_size: int | None = None
    batch_nodes: str = "all"
    schedule: Any = None
    schedule_every: str = "epoch"

    def __post_init__(self) -> None:
        """Each field checked here, in one line naming it, not when training meets it."""
        check_positive_int(self.epochs, "TrainConfig epochs")
        if not (isinstance(self.optimizer, str) and self.optimizer.lower() in OPTIMIZERS):
            raise ValueError(
                f"TrainConfig optimizer must be one of {', '.join(map(repr, OPTIMIZERS))}, "
                f"got {self.optimizer!r}"
            )
        check_nonnegative_number(self.lr, "TrainConfig lr", allow_zero=False)
        check_nonnegative_number(self.weight_decay, "TrainConfig weight_decay")
        if self.loss_threshold is not None:  # a loss is >= 0: below a negative one never
            check_nonnegative_number(self.loss_threshold, "TrainConfig loss_threshold")
        check_nonnegative_int(self.checkpoint_every, "TrainConfig checkpoint_every")
        check_nonnegative_int(self.seed, "TrainConfig seed")  # default_rng([seed, k])
        check_choice(self.init, INITIALISERS, "TrainConfig init")
        object.__setattr__(
            self, "diagnostics", check_bool(self.diagnostics, "TrainConfig diagnostics")
        )
        size = self.batch_size
        if size is not None and (type(size) is not int or size < 1):  # a bool is refused too
            raise ValueError(f"TrainConfig batch_size must be None or a positive int, got {size!r}")
        check_choice(self.batch_nodes, ("all", "train"), "TrainConfig batch_nodes")
        if self.batch_nodes == "train" and self.batch_size is None:
            raise ValueError("TrainConfig batch_nodes='train' cuts batches: set batch_size too")
        check_schedule(self.schedule, self.schedule_every, "TrainConfig")


@dataclass
class RunResult:
    """Outcome of one node-level run (one seed).

    For multi-label targets the two accuracies hold the macro ROC-AUC.

    Parameters
    ----------
    seed : int
        The run's seed.
    best_epoch : int
        0-based epoch with the best validation accuracy (the first on ties; the last epoch
        without validation nodes).
    val_acc : float
        Validation accuracy at ``best_epoch`` (NaN without validation nodes).
    test_acc : float
        Test accuracy at ``best_epoch``.
    epochs_run : int
        Epochs trained, resumed ones included.
    final_train_loss : float
        The last epoch's training loss.
    params : dict of str to array
        The final parameters (left out of ``repr`` and :meth:`as_dict`).
    """

    seed: int
    best_epoch: int
    val_acc: float
    test_acc: float
    epochs_run: int
    final_train_loss: float
    params: dict[str, Any] = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "params"}


@dataclass(frozen=True)
class GraphTrainConfig:
    """How to train a graph-level model; the model and the data are passed separately.

    Parameters
    ----------
    epochs : int, default 100
        Positive: epochs to train (fewer if ``stop_below_lr`` ends the run).
    batch_size : int, default 64
        Positive: graphs per training step.
    lr : float, default 1e-3
        Positive learning rate of Adam (Dwivedi and Bresson's GT on ZINC).
    weight_decay : float, default 0.0
        ``>= 0``: L2 penalty added to the gradient.
    loss : str or None, default None
        ``"l1"`` (MAE, as on ZINC), ``"mse"`` or ``"bce"`` (multi-label; the only one that
        skips missing labels); ``None``: ``"l1"`` for regression, ``"bce"`` for
        multi-label targets.
    seed : int, default 0
        ``>= 0``: parameters from ``default_rng([seed, 0])``; permutations, sign flips and
        dropout from ``default_rng([seed, 1])``.
    sign_flip : bool, default True
        Flip the Laplacian encodings' signs at random in training (one sign per column).
    pe : str, default "laplacian"
        The positional encodings computed for the model's ``pe_dim`` (or
        ``lpe_eigenpairs``) columns: ``"laplacian"`` eigenvectors, ``"random-walk"`` return
        probabilities, or ``"learned-laplacian"``, the padded eigenpairs SAN's learned
        encoding reads (with a model with ``lpe_eigenpairs`` and only with one).
    checkpoint_every : int, default 0
        ``>= 0``: epochs between checkpoints in the run folder; 0: none.
    dtype : str, default "float64"
        Training precision: ``"float64"`` or ``"float32"``.
    eval_batch_size : int, default 512
        Positive: graphs per evaluation forward (memory only: results do not depend on it).
    schedule : MultiStepLR, ReduceLROnPlateau or None, default None
        A learning-rate schedule (:mod:`refimpl.schedules`) stepped once per epoch:
        ``ReduceLROnPlateau`` on the validation metric (MAE: mode ``"min"``; ROC-AUC:
        ``"max"``), or ``MultiStepLR``.
    stop_below_lr : float or None, default None
        ``>= 0``: end the run once the schedule's rate falls below it (needs a
        ``schedule``); ``None``: never.
    """

    epochs: int = 100
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    loss: str | None = None
    seed: int = 0
    sign_flip: bool = True
    pe: str = "laplacian"
    checkpoint_every: int = 0
    dtype: str = "float64"
    eval_batch_size: int = 512
    schedule: Any = None
    stop_below_lr: float | None = None

    def __post_init__(self) -> None:
        """Each field checked here, in one line naming it, not when training meets it (after
        the positional encodings are computed)."""
        for name in ("epochs", "batch_size", "eval_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GraphTrainConfig {name} must be a positive int, got {value!r}")
        check_nonnegative_number(self.lr, "GraphTrainConfig lr", allow_zero=False)
        check_nonnegative_number(self.weight_decay, "GraphTrainConfig weight_decay")
        if self.loss not in (None, *LOSSES):
            raise ValueError(
                f"GraphTrainConfig loss must be None or one of {sorted(LOSSES)}, got {self.loss!r}"
            )
        check_nonnegative_int(self.seed, "GraphTrainConfig seed")  # default_rng([seed, k])
        if self.pe not in PE_KINDS:
            raise ValueError(f"GraphTrainConfig pe must be one of {PE_KINDS}, got {self.pe!r}")
        object.__setattr__(
            self, "sign_flip", check_bool(self.sign_flip, "GraphTrainConfig sign_flip")
        )
        check_nonnegative_int(self.checkpoint_every, "GraphTrainConfig checkpoint_every")
        check_schedule(self.schedule, "epoch", "GraphTrainConfig")
        if self.stop_below_lr is not None:
            check_nonnegative_number(self.stop_below_lr, "GraphTrainConfig stop_below_lr")
            if self.schedule is None:
                raise ValueError(
                    "GraphTrainConfig stop_below_lr needs a schedule to lower the rate"
                )
        if self.dtype not in ("float32", "float64"):
            raise ValueError(
                f"GraphTrainConfig dtype must be 'float32' or 'float64', got {self.dtype!r}"
            )


@dataclass
class GraphRunResult:
    """Outcome of one graph-level run (one seed).

    Parameters
    ----------
    seed : int
        The run's seed.
    metric : str
        ``"mae"`` (regression; lower is better) or ``"roc_auc"`` (multi-label; macro
        ROC-AUC over the observed labels, higher is better).
    best_epoch : int
        0-based epoch with the best validation metric (the first on ties; the last epoch
        without validation graphs).
    val_metric : float
        The validation metric at ``best_epoch``.
    test_metric : float
        The test metric at ``best_epoch``.
    epochs_run : int
        Epochs trained, resumed ones included.
    final_train_loss : float
        The last epoch's training loss.
    params : dict of str to array
        The final parameters (left out of ``repr`` and :meth:`as_dict`).
    model_state : dict of str to array, default empty
        The final state beside them (BatchNorm's running statistics); empty for a model
        without state.
    unscored : dict of str to str, default empty
        Why a split's metric is NaN every epoch, by split (``"val"``, ``"test"``): no graph,
        or a ROC-AUC undefined on its labels. :meth:`as_dict` leaves it out when empty.
    """

    seed: int
    metric: str
    best_epoch: int
    val_metric: float
    test_metric: float
    epochs_run: int
    final_train_loss: float
    params: dict[str, Any] = field(repr=False)
    model_state: dict[str, Any] = field(default_factory=dict, repr=False)
    unscored: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The summary written to ``summary.json``: every field but the arrays, and
        ``unscored`` only when a split is."""
        left_out = ("params", "model_state") + (() if self.unscored else ("unscored",))
        return {k: v for k, v in asdict(self).items() if k not in left_out}
