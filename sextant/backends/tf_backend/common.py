"""Pieces shared by the TensorFlow training modes (no TensorFlow import here)."""

from __future__ import annotations

from typing import Any

import numpy as np


def nbytes(arrays: Any) -> int:
    return int(sum(int(np.prod(a.shape)) * 4 for a in arrays))  # fp32 only
