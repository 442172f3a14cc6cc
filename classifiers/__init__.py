"""Prompt classifier: will speculative decoding pay off for this request ("structured") or not "
"("open-ended")?"""

from classifiers.model import Classifier, Prediction, load_default

__all__ = ["Classifier", "Prediction", "load_default"]
