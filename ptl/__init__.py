"""ptl: fast, reproducible YOLO26 detector training in C/CUDA with a Lightning-like Python face."""
from . import _C, callbacks, cuda, io, metrics
from .callbacks import (Callback, CloseMosaic, EarlyStopping, LearningRateMonitor, ModelCheckpoint,
                        ProgressBar)
from ._C import CudaError, Tensor, empty, from_numpy, tensor, zeros
from .io import load_safetensors, save_safetensors
from .data import DataWarning, DetectionData
from .model import Detector
from .random import Generator, full, rand, randn, seed_everything

__version__ = "0.1.0"

float32, float64, float16, bfloat16 = "float32", "float64", "float16", "bfloat16"
int32, int64, uint8 = "int32", "int64", "uint8"

__all__ = [
    "Callback", "CloseMosaic", "CudaError", "DataWarning", "DetectionData", "Detector", "EarlyStopping", "Generator",
    "LearningRateMonitor", "ModelCheckpoint", "ProgressBar", "Tensor", "cuda", "empty", "from_numpy",
    "full", "load_safetensors", "rand", "randn", "save_safetensors", "seed_everything", "tensor", "zeros",
    "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8",
]
