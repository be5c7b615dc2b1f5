"""One contrast pooled over several datasets (or any setting that replicates it): a random-effects meta-analysis of
the datasets' effects (arm - baseline) and their standard errors (numpy and scipy only).

The datasets differ in more than their noise, so each is taken to have its own true effect, drawn around a mean
with a between-dataset variance tau^2 (DerSimonian & Laird 1986, moment estimator). The mean's interval and test
follow Hartung & Knapp (2001) and Sidik & Jonkman (2002): Student's t on k - 1 degrees of freedom with the scale
estimated from the datasets' spread, which keeps its coverage with as few datasets as a study has (the normal
interval is too narrow there); that scale is never taken below 1, so the variance never falls below
DerSimonian-Laird's (the usual truncation: Knapp & Hartung 2003; Röver, Knapp & Friede 2015): two datasets that
happen to agree would otherwise give an interval far narrower than either dataset's own. Heterogeneity:
Cochran's Q and its test, I^2 (Higgins & Thompson 2002), and the 95% prediction interval of the effect on a new
dataset (Higgins, Thompson & Spiegelhalter 2009; t on k - 2).
"""

import math

import numpy as np
from scipy import stats

LEVEL = 0.95


def random_effects(effects: list[float], errors: list[float]) -> dict:
    """The random-effects mean of effects with standard errors `errors` (each > 0): {"k", "effect", "se", "low",
    "high", "p_value", "tau2", "i2", "q", "q_p", "pred_low", "pred_high", "fixed"} (nan where k is too small:
    the mean needs 2 datasets, the prediction interval 3)."""
    y, v = np.asarray(effects, float), np.asarray(errors, float) ** 2
    k = len(y)
    out = dict.fromkeys(("effect", "se", "low", "high", "p_value", "tau2", "i2", "q", "q_p", "fixed"), math.nan)
    out.update(k=k, pred_low=math.nan, pred_high=math.nan)
    if k < 2:
        return out
    w = 1 / v
    fixed = float(np.sum(w * y) / np.sum(w))
    q = float(np.sum(w * (y - fixed) ** 2))
    tau2 = max(0.0, (q - (k - 1)) / float(np.sum(w) - np.sum(w**2) / np.sum(w)))
    w_re = 1 / (v + tau2)
    mean = float(np.sum(w_re * y) / np.sum(w_re))
    scale = float(np.sum(w_re * (y - mean) ** 2)) / (k - 1)  # Hartung-Knapp's, truncated at 1 (DL's variance)
    se = math.sqrt(max(1.0, scale) / float(np.sum(w_re)))
    half = stats.t.ppf((1 + LEVEL) / 2, k - 1) * se
    p = float(2 * stats.t.sf(abs(mean) / se, k - 1)) if se > 0 else float(mean == 0)
    out.update(effect=mean, se=se, low=float(mean - half), high=float(mean + half), p_value=p, tau2=tau2, q=q)
    out["fixed"] = fixed
    out.update(q_p=float(stats.chi2.sf(q, k - 1)), i2=max(0.0, (q - (k - 1)) / q) if q > 0 else 0.0)
    if k >= 3:
        spread = stats.t.ppf((1 + LEVEL) / 2, k - 2) * math.sqrt(tau2 + se**2)
        out.update(pred_low=float(mean - spread), pred_high=float(mean + spread))
    return out
