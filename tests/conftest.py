"""Test-wide settings: progress bars off (the kernels nbval starts inherit this), the book's
tools importable, torch on one thread as in the chapters."""

import os
import sys
from pathlib import Path

import torch

os.environ.setdefault("PAPERNOTES_QUIET", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
torch.set_num_threads(1)
