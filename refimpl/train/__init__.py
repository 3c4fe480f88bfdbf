"""Training: the node-level loop, the graph-level loop, checkpoints, and runs over several seeds."""

from refimpl.train.checkpoint import Checkpoint, load_checkpoint, read_checkpoint, save_checkpoint
from refimpl.train.config import GraphRunResult, GraphTrainConfig, RunResult, TrainConfig
from refimpl.train.experiment import format_summary, mean_ci95, run_seeds, summarize
from refimpl.train.graph_level import train_graph_model
from refimpl.train.loop import TrainingDiverged, relative_grad_norms, train_model

__all__ = [
    "Checkpoint",
    "GraphRunResult",
    "GraphTrainConfig",
    "RunResult",
    "TrainConfig",
    "TrainingDiverged",
    "format_summary",
    "load_checkpoint",
    "mean_ci95",
    "read_checkpoint",
    "relative_grad_norms",
    "run_seeds",
    "save_checkpoint",
    "summarize",
    "train_graph_model",
    "train_model",
]
