"""The isotonic calibration table: how it is read per request, fitted in training and carried by the model."""

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from classifiers.calibration import P_FLOOR, Calibration, fit_isotonic, logit
from classifiers.model import Classifier

TABLE = Calibration(z=(-2.0, 0.0, 2.0), p=(0.1, 0.5, 0.9))


def test_table_interpolates_between_knots_and_holds_flat_beyond_them() -> None:
    assert TABLE(0.0) == pytest.approx(0.5)
    assert TABLE(1.0) == pytest.approx(0.7)
    assert TABLE(-1.5) == pytest.approx(0.2)
    assert TABLE(-50.0) == 0.1 and TABLE(50.0) == 0.9


def test_table_is_monotone() -> None:
    ps = [TABLE(x / 10) for x in range(-40, 41)]
    assert ps == sorted(ps)


def test_logit_is_kept_off_the_ends() -> None:
    assert logit(0.5) == 0.0
    assert logit(1.0) == pytest.approx(math.log((1 - P_FLOOR) / P_FLOOR))
    assert logit(0.0) == pytest.approx(-logit(1.0))


def _clf(table: Calibration | None) -> Classifier:
    return Classifier(bias=0.0, sparse={"wt": {"json": 30.0, "poem": -30.0}}, dense={}, calibration=table)


def test_the_table_maps_the_prompts_log_odds() -> None:
    assert _clf(TABLE).predict({"prompt": "json"}).p_structured == pytest.approx(0.9)
    assert _clf(TABLE).predict({"prompt": "poem"}).p_structured == pytest.approx(0.1)
    # without a table the log-odds go through the sigmoid
    assert _clf(None).calibrated(1.25) == 1.25
    assert _clf(None).predict({"prompt": "json"}).p_structured > 0.99


def test_request_fields_still_move_a_prompt_beyond_the_last_knot() -> None:
    clf = _clf(TABLE)
    body = {"prompt": "json"}
    plain = clf.predict(body).p_structured
    assert clf.predict({**body, "tools": [{"type": "function"}]}).p_structured > plain
    assert clf.predict({**body, "temperature": 1.8}).p_structured < plain


def test_table_survives_save_and_load(tmp_path: Path) -> None:
    clf = _clf(TABLE)
    path = tmp_path / "m.json.gz"
    clf.save(path)
    again = Classifier.load(path)
    assert again.calibration == TABLE
    assert again.predict({"prompt": "poem json"}) == clf.predict({"prompt": "poem json"})


def test_isotonic_fit_is_monotone_small_and_follows_the_data() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=4000) * 3
    # the true probability is steeper than the scores say: 1 / (1 + exp(-2 z))
    y = (rng.random(4000) < 1 / (1 + np.exp(-2 * z))).astype(int)
    table = fit_isotonic(z, y, np.ones(len(y)), knots=32)
    assert len(table.z) <= 32 and list(table.z) == sorted(set(table.z))
    assert list(table.p) == sorted(table.p)
    assert table.p[0] >= P_FLOOR and table.p[-1] <= 1 - P_FLOOR
    assert table(1.0) > 1 / (1 + math.exp(-1.0)) + 0.05
    assert table(-1.0) < 1 / (1 + math.exp(1.0)) - 0.05


def test_an_artefact_without_a_table_still_loads_and_an_unknown_format_does_not(tmp_path: Path) -> None:
    raw = _clf(None).to_json()
    del raw["calibration"]
    for version, loads in ((2, True), (1, False)):
        path = tmp_path / f"v{version}.json.gz"
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            json.dump({**raw, "format": version}, fh)
        if loads:
            assert Classifier.load(path).calibration is None
        else:
            with pytest.raises(ValueError, match="unsupported model format"):
                Classifier.load(path)
