"""ptl: fast, reproducible YOLO26 detector training in C/CUDA with a Lightning-like Python face."""
from . import _openmp  # noqa: F401  (loads ptl._C with its OpenMP settings: must come first)
from . import _C, callbacks, cuda, io, loggers, metrics, optim
from .callbacks import (Callback, CloseMosaic, EarlyStopping, LearningRateMonitor, ModelCheckpoint,
                        ProgressBar)
from ._C import CudaError, Tensor, empty, from_numpy, tensor, zeros
from ._version import __version__
from .io import load_safetensors, save_safetensors
from .data import DataWarning, DetectionData
from .errors import CheckpointError, ConfigError, DivergenceError, ResumeWarning
from .loggers import CSVLogger, TensorBoardLogger
from .model import Detector
from .objective import LOSS_NAMES, loss_items, o2m_weight, objective
from .optim import digest
from .random import Generator, full, rand, randn, seed_everything
from .trainer import Trainer

float32, float64, float16, bfloat16 = "float32", "float64", "float16", "bfloat16"
int32, int64, uint8 = "int32", "int64", "uint8"

__all__ = [
    "CSVLogger", "Callback", "CloseMosaic", "CudaError", "DataWarning", "DetectionData", "Detector", "EarlyStopping", "Generator",
    "LOSS_NAMES", "LearningRateMonitor", "ModelCheckpoint", "ProgressBar", "Tensor", "TensorBoardLogger", "Trainer", "cuda", "empty", "from_numpy",
    "digest", "full", "load_safetensors", "loss_items", "o2m_weight", "objective", "optim", "rand", "randn", "save_safetensors", "seed_everything", "tensor", "zeros",
    "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8",
    "CheckpointError", "ConfigError", "DivergenceError", "ResumeWarning",
]
