"""The calibration table: an isotonic map from the linear model's log-odds to ``p_structured``.

A single sigmoid (Platt scaling) fitted on out-of-fold scores was too timid on sources the model never saw:
rows it put near 0.85 were nearly all structured, rows near 0.45 mostly so. An isotonic regression on the
same out-of-fold scores follows that shape; it ships as a short table of knots, read per request by
bisection and linear interpolation (plain Python, no numerical libraries at serving time).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

P_FLOOR = 0.005  # the table never says "certain", so that request-field shifts can still move p
KNOTS = 64  # at most this many knots ship


def logit(p: float) -> float:
    """Log-odds of ``p``, kept within [P_FLOOR, 1 - P_FLOOR]."""
    p = min(1.0 - P_FLOOR, max(P_FLOOR, p))
    return math.log(p / (1.0 - p))


@dataclass(frozen=True, slots=True)
class Calibration:
    """Knots ``z`` (strictly increasing log-odds) and ``p`` (non-decreasing probabilities); linear between
    knots, flat beyond the ends."""

    z: tuple[float, ...]
    p: tuple[float, ...]

    def __call__(self, z: float) -> float:
        zs, ps = self.z, self.p
        i = bisect.bisect_right(zs, z)
        if i == 0:
            return ps[0]
        if i == len(zs):
            return ps[-1]
        z0, z1 = zs[i - 1], zs[i]
        return ps[i - 1] + (ps[i] - ps[i - 1]) * (z - z0) / (z1 - z0)


def fit_isotonic(z: np.ndarray, y: np.ndarray, w: np.ndarray, knots: int = KNOTS) -> Calibration:
    """Isotonic regression of the labels ``y`` on the scores ``z`` (row weights ``w``), thinned to at most
    ``knots`` knots at quantiles of the fitted breakpoints. Training only: needs scikit-learn."""
    import numpy as np
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(out_of_bounds="clip", y_min=P_FLOOR, y_max=1.0 - P_FLOOR, increasing=True)
    iso.fit(z, y, sample_weight=w)
    zs = np.asarray(iso.X_thresholds_, dtype=float)
    if len(zs) > knots:
        zs = np.quantile(zs, np.linspace(0.0, 1.0, knots))
    zs = np.unique(np.round(zs, 4))
    ps = np.maximum.accumulate(np.round(iso.predict(zs), 4))
    return Calibration(z=tuple(float(v) for v in zs), p=tuple(float(v) for v in ps))
