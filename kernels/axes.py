"""A case's axes as kernels declare them: integer sizes, and categorical values such as a dtype."""
from __future__ import annotations

from typing import Mapping

AxisValue = int | str
Axes = Mapping[str, AxisValue]
