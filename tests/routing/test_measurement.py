"""Measurement by need: uncertain requests and one per interval are measured, the rest pass through."""

from __future__ import annotations

from gateway.routing.alpha_model import AlphaModel
from gateway.routing.features import extract
from gateway.routing.measurement import FRUITLESS_MAX_S, MeasurementGate
from gateway.routing.policy import Decision

BODY = {"model": "m", "prompt": "Return a JSON object with the fields name and age."}


def _decision(model: AlphaModel, *, explore: bool = False) -> Decision:
    features = extract(BODY, "json", 0.8)
    prediction = model.predict(features, 0.8)
    return Decision(
        pool="speculative",
        prompt_class="structured",
        reason="explore" if explore else "predicted-gain",
        p_structured=0.8,
        kind="json",
        explore=explore,
        alpha=prediction.alpha,
        alpha_sd=prediction.sd,
        features=features,
        prediction=prediction,
    )


def _known(measurements: int = 8) -> AlphaModel:
    """A model that has measured this request's features often enough to be sure of it."""
    model = AlphaModel(600.0)
    features = extract(BODY, "json", 0.8)
    for _ in range(measurements):
        model.observe(features, 0.8, 0.8, 20, model.predict(features, 0.8))
    return model


def test_certain_and_recently_measured_passes_through():
    gate = MeasurementGate(interval_s=0.05, sd_share=0.4)
    d = _decision(_known())
    assert d.prediction is not None and d.prediction.sd_share < 0.4
    assert gate.verdict(d, "speculative", 10.0) == "interval"  # the pool's first: measured
    assert gate.verdict(d, "speculative", 10.01) == "passed"
    assert gate.verdict(d, "speculative", 10.049) == "passed"


def test_uncertain_is_measured_however_recent_the_last_measurement():
    gate = MeasurementGate(interval_s=10.0, sd_share=0.4)
    gate.streamed("speculative", 5.0)
    d = _decision(AlphaModel(600.0))  # nothing learned: sd is the prior's
    assert d.prediction is not None and d.prediction.sd_share > 0.4
    assert [gate.verdict(d, "speculative", 5.0 + i / 100) for i in range(3)] == ["uncertain"] * 3


def test_explored_requests_are_measured():
    gate = MeasurementGate(interval_s=10.0, sd_share=0.4)
    gate.streamed("speculative", 1.0)
    assert gate.verdict(_decision(_known(), explore=True), "speculative", 1.0) == "uncertain"


def test_interval_elapsed_is_measured_and_restarts_the_interval():
    gate = MeasurementGate(interval_s=0.05, sd_share=0.4)
    d = _decision(_known())
    gate.streamed("speculative", 1.0)  # a stream is a measurement too
    assert gate.verdict(d, "speculative", 1.04) == "passed"
    assert gate.verdict(d, "speculative", 1.05) == "interval"
    assert gate.verdict(d, "speculative", 1.09) == "passed"
    assert gate.verdict(d, "speculative", 1.11) == "interval"


def test_intervals_are_per_pool():
    gate = MeasurementGate(interval_s=1.0, sd_share=0.4)
    d = _decision(_known())
    gate.streamed("speculative", 1.0)
    assert gate.verdict(d, "baseline", 1.0) == "interval"
    assert gate.verdict(d, "speculative", 1.0) == "passed"


def test_a_model_grows_certain_after_a_few_measurements():
    """The default threshold passes a request through once a handful of its kind were measured."""
    gate = MeasurementGate(interval_s=60.0, sd_share=0.4)
    model = AlphaModel(600.0)
    features = extract(BODY, "json", 0.8)
    verdicts = []
    for i in range(10):
        d = _decision(model)
        verdicts.append(gate.verdict(d, "speculative", float(i)))
        if verdicts[-1] != "passed":
            model.observe(features, 0.8, 0.8, 20, d.prediction)
    assert verdicts[0] == "uncertain" and "passed" in verdicts
    first_passed = verdicts.index("passed")
    assert set(verdicts[first_passed:]) == {"passed"}


def test_zero_interval_measures_everything_and_without_a_prediction_only_the_interval_counts():
    always = MeasurementGate(interval_s=0.0, sd_share=0.4)
    d = _decision(_known())
    assert [always.verdict(d, "speculative", 1.0) for _ in range(3)] == ["interval"] * 3
    per_kind = MeasurementGate(interval_s=1.0, sd_share=0.4)
    bare = Decision(pool="speculative", prompt_class="structured", reason="r", p_structured=0.8, kind="json")
    assert [per_kind.verdict(bare, "speculative", t) for t in (0.0, 0.5, 1.0)] == [
        "interval",
        "passed",
        "interval",
    ]


def test_snapshot_counts_verdicts_per_pool():
    gate = MeasurementGate(interval_s=1.0, sd_share=0.4)
    known, unknown = _decision(_known()), _decision(AlphaModel(600.0))
    for t, d in ((0.0, known), (0.1, known), (0.2, unknown), (0.3, known)):
        gate.verdict(d, "speculative", t)
    snap = gate.snapshot()
    assert snap["interval_s"] == 1.0 and snap["sd_share"] == 0.4
    assert snap["pools"]["speculative"] == {
        "uncertain": 1,
        "interval": 1,
        "passed": 2,
        "measured": 2,
    }


def test_after_a_measurement_that_taught_nothing_only_the_interval_counts_until_one_teaches():
    gate = MeasurementGate(interval_s=1.0, sd_share=0.4)
    unknown = _decision(AlphaModel(600.0))
    assert gate.verdict(unknown, "speculative", 0.0) == "uncertain"
    gate.taught("speculative", learned=False)  # e.g. an upstream that reports no usage per chunk
    assert gate.verdict(unknown, "speculative", 0.5) == "passed"
    assert gate.verdict(_decision(AlphaModel(600.0), explore=True), "speculative", 0.6) == "passed"
    assert gate.verdict(unknown, "baseline", 0.6) == "uncertain"  # other pools are not affected
    assert gate.verdict(unknown, "speculative", 1.0) == "interval"
    gate.taught("speculative", learned=True)
    assert gate.verdict(unknown, "speculative", 1.1) == "uncertain"
    assert gate.snapshot()["fruitless"] == []


def test_each_further_fruitless_measurement_doubles_the_pools_interval_up_to_a_cap():
    gate = MeasurementGate(interval_s=1.0, sd_share=0.4)
    unknown = _decision(AlphaModel(600.0))
    t = 0.0
    gaps = []
    for _ in range(6):
        # the next measured request comes as soon as the pool's interval allows; each teaches nothing
        start = t
        while gate.verdict(unknown, "speculative", t) == "passed":
            t += 0.25
        gaps.append(t - start)
        gate.taught("speculative", learned=False)
    assert gaps == [0.0, 1.0, 2.0, 4.0, FRUITLESS_MAX_S, FRUITLESS_MAX_S]
    assert gate.snapshot()["interval_by_pool_s"] == {"speculative": FRUITLESS_MAX_S}
    gate.verdict(unknown, "baseline", t)  # other pools keep the setting's interval
    gate.taught("baseline", learned=False)
    assert gate.verdict(unknown, "baseline", t + 1.0) == "interval"
    gate.taught("speculative", learned=True)  # one that teaches: back to the setting's interval
    assert gate.verdict(unknown, "speculative", t + 0.25) == "uncertain"
    assert gate.snapshot()["fruitless"] == ["baseline"]


def test_an_interval_above_the_cap_is_kept_for_a_fruitless_pool():
    gate = MeasurementGate(interval_s=10.0, sd_share=0.4)
    for _ in range(4):
        gate.taught("speculative", learned=False)
    assert gate.snapshot()["interval_by_pool_s"] == {"speculative": 10.0}


def test_answers_too_short_to_show_a_step_say_nothing_about_the_upstream():
    """One-token answers (a client asking yes or no) have no step to read from any upstream: they marked
    a vLLM pool as one that reports no acceptance, and the uncertain requests after them went unmeasured."""
    gate = MeasurementGate(interval_s=1.0, sd_share=0.4)
    unknown = _decision(AlphaModel(600.0))
    for tokens in (1, 2, 0, 1, 1):
        gate.taught("speculative", learned=False, completion_tokens=tokens)
    assert gate.snapshot()["fruitless"] == []
    assert gate.verdict(unknown, "speculative", 0.1) == "uncertain"
    gate.taught("speculative", learned=False, completion_tokens=40)  # long enough, and still nothing
    assert gate.snapshot()["fruitless"] == ["speculative"]
    gate.taught("speculative", learned=False, completion_tokens=None)  # no usage at all: nothing either
    assert gate.snapshot()["interval_by_pool_s"] == {"speculative": 2.0}
