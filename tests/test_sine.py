"""examples/sine_bnn.py: the predictive std grows outside the training range (docs/method.md s.8)."""

import importlib.util
import math
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sine_bnn.py"


def _load():
    spec = importlib.util.spec_from_file_location("sine_bnn", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_full_bnn_std_grows_outside_training_range(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = _load().run(fast=True, seed=0, out=tmp_path)
    finally:
        torch.set_num_threads(threads)
    full, last = result["fullbnn"], result["last_layer"]
    assert full["ratio"] >= 3.0, full
    assert full["train_rmse"] < 0.2  # it fits sin(x) inside the data
    assert math.isfinite(last["ratio"]) and last["ratio"] > 0 and last["train_rmse"] < 0.2
    assert Path(result["plot"]).stat().st_size > 1000
