"""What routing has learned survives a restart through ``routing.state_file``, and only where it holds."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.config import ConfigError, RoutingConfig, Strategy, load_settings
from gateway.observability import Metrics
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.alpha_model import PRIOR_VAR
from gateway.routing.features import SLOTS
from gateway.routing.learned import Deployment, LearnedState, check_path, deployment
from gateway.routing.policy import Outcome, RouteRequest
from gateway.stack import demo_config
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.scrape import Scraper
from tests.routing.test_policy import FixedClassifier

OPEN = RouteRequest({"prompt": "tell me a story"}, "completions")
HERE = Deployment(
    feature_scheme=1,
    slots=SLOTS,
    speculative_models=("m",),
    num_speculative_tokens=7,
    draft_cost_ratio=0.05,
)


def _policy() -> AdaptivePolicy:
    pools = {
        "speculative": Pool("speculative", ["m"], [Endpoint("speculative", "s0", "http://s0")], 7, 0.05),
        "baseline": Pool("baseline", ["m"], [Endpoint("baseline", "b0", "http://b0")]),
    }
    scraper = Scraper(None, pools, Metrics(), 1.0)  # type: ignore[arg-type]
    cfg = RoutingConfig(strategy=Strategy.ADAPTIVE, seed=7, exploration_rate=0.0)
    return AdaptivePolicy.build(Strategy.ADAPTIVE, FixedClassifier(), cfg, pools, scraper, Metrics())


def _taught() -> AdaptivePolicy:
    """A policy that measured the open-ended prompt at alpha ≈ 0.9 (the prior says 0.27), and timed
    both pools' steps."""
    p = _policy()
    d = p.decide(OPEN)
    for _ in range(10):
        p.observe(Outcome(d, "speculative", "s0", 200, 0.05, 1.0, 180, 30, 150, 210, 30))
    for _ in range(3):
        p.model.observe_baseline(0.03, 1.0)
    p._learn_residence("speculative", 2.0, 100)
    return p


def _keeper(policy: AdaptivePolicy, path: Path, here: Deployment = HERE) -> LearnedState:
    return LearnedState(policy, path, here, 60.0)


def test_a_restarted_policy_routes_as_the_one_that_learned(tmp_path: Path) -> None:
    path = tmp_path / "learned.json"
    before = _taught()
    _keeper(before, path).save()

    fresh = _policy()
    # the prior: open-ended prose gains nothing (never measured, it may be sent to be measured)
    assert fresh.decide(OPEN).reason in ("no-gain", "explore")
    keeper = _keeper(fresh, path)
    assert keeper.load()
    after = fresh.decide(OPEN)
    assert (after.pool, after.reason) == ("speculative", "predicted-gain")
    assert after.alpha == pytest.approx(before.decide(OPEN).alpha, abs=1e-6)
    assert fresh.alpha_model.updates == before.alpha_model.updates == 10
    assert fresh.model.step_s == pytest.approx(before.model.step_s)
    assert fresh.model.base_observations == 3 and list(fresh.model.base_steps) == list(
        before.model.base_steps
    )
    assert fresh.residence_s == before.residence_s and fresh.mean_tokens == before.mean_tokens
    # evidence fades with the time between the save and the load (milliseconds here, more on a busy
    # machine); everything else about each kind comes back as it was
    restored, taught = fresh.estimates.snapshot()["kinds"], before.estimates.snapshot()["kinds"]
    assert [k.pop("evidence") for k in restored] == pytest.approx(
        [k.pop("evidence") for k in taught], abs=0.01
    )
    assert restored == taught
    assert "restored 10 acceptance updates" in keeper.restored


def test_time_down_counts_as_time_passed(tmp_path: Path) -> None:
    """Saved long ago, the weights' certainty has faded (they are explored again); their means stay."""
    taught = _taught()
    _keeper(taught, tmp_path / "now.json").save()
    keeper = _keeper(taught, tmp_path / "old.json")
    old = keeper.take()
    old.saved_at -= 100 * taught.alpha_model.half_life_s
    keeper._write(old)

    recent, stale = _policy(), _policy()
    assert _keeper(recent, tmp_path / "now.json").load()
    assert _keeper(stale, tmp_path / "old.json").load()
    fresh_sd = _policy().decide(OPEN).alpha_sd
    assert recent.decide(OPEN).alpha_sd < 0.7 * fresh_sd
    # all the certainty gone, the learned mean kept
    assert stale.decide(OPEN).alpha_sd == pytest.approx(fresh_sd, rel=1e-3)
    assert stale.decide(OPEN).alpha == pytest.approx(recent.decide(OPEN).alpha, abs=1e-6)
    # the per-kind evidence decayed to nothing
    assert all(k["evidence"] < 1e-6 for k in stale.estimates.snapshot()["kinds"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("speculative_models", ("other-model",)),
        ("num_speculative_tokens", 4),
        ("draft_cost_ratio", 0.2),
        ("feature_scheme", 2),
        ("slots", SLOTS * 2),
    ],
)
def test_a_file_written_for_another_deployment_is_not_taken_up(
    tmp_path: Path, field: str, value: object, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "learned.json"
    _keeper(_taught(), path, HERE.model_copy(update={field: value})).save()
    fresh = _policy()
    keeper = _keeper(fresh, path)
    with caplog.at_level(logging.WARNING, "specroute.routing"):
        assert not keeper.load()
    assert f"{field} changed" in keeper.restored and f"{field} changed" in caplog.text
    assert fresh.alpha_model.updates == 0 and fresh.decide(OPEN).reason in ("no-gain", "explore")


def _corrupt(text: str, tmp_path: Path) -> Path:
    good = json.loads(_keeper(_taught(), tmp_path / "good.json").take().model_dump_json())
    if text == "truncated":
        raw = json.dumps(good)[:5000]
    elif text == "short weights":
        good["policy"]["acceptance"]["mean"] = good["policy"]["acceptance"]["mean"][:100]
        raw = json.dumps(good)
    elif text == "nan":
        raw = json.dumps(good).replace('"shift_offset": 0.0', '"shift_offset": NaN')
    elif text == "negative variance":
        good["policy"]["acceptance"]["var"][5] = -1.0
        raw = json.dumps(good)
    elif text == "older format":
        good["format"] = 0
        raw = json.dumps(good)
    else:
        raw = text
    path = tmp_path / "learned.json"
    path.write_text(raw)
    return path


@pytest.mark.parametrize(
    "text", ["truncated", "short weights", "nan", "negative variance", "older format", "", "[]", "not json"]
)
def test_a_damaged_file_is_refused_whole_and_replaced_at_the_next_save(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = _corrupt(text, tmp_path)
    fresh = _policy()
    keeper = _keeper(fresh, path)
    with caplog.at_level(logging.WARNING, "specroute.routing"):
        assert not keeper.load()
    assert keeper.restored.startswith("not taken up: not a state file") and "not taken up" in caplog.text
    # nothing half taken up: the policy is the prior's
    assert fresh.alpha_model.updates == 0 and fresh.model.base_observations == 0
    assert all(v == PRIOR_VAR for v in fresh.alpha_model.var)
    keeper.save()
    assert _keeper(_policy(), path).load()


def test_no_file_yet_is_a_first_start_not_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    keeper = _keeper(_policy(), tmp_path / "learned.json")
    with caplog.at_level(logging.WARNING, "specroute.routing"):
        assert not keeper.load()
    assert "no file yet" in keeper.restored and not caplog.records


def test_a_failed_save_is_counted_and_logged_and_routing_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    metrics = Metrics(CollectorRegistry())
    keeper = LearnedState(_taught(), folder / "learned.json", HERE, 60.0, metrics=metrics)
    keeper.save()
    saved = keeper.saved_at
    moved = tmp_path / "elsewhere"
    folder.rename(moved)  # the volume went away under the running gateway
    with caplog.at_level(logging.WARNING, "specroute.routing"):
        keeper.save()
    assert keeper.save_errors == 1 and keeper.last_error and keeper.saved_at == saved
    assert "cannot write it" in caplog.text
    # where monitoring sees it (a volume gone read-only in month two would otherwise show only on restart)
    assert metrics.registry.get_sample_value("specroute_state_save_errors_total") == 1
    moved.rename(folder)
    keeper.save()
    assert keeper.last_error is None and keeper.save_errors == 1
    assert sorted(p.name for p in folder.iterdir()) == ["learned.json"]  # no temporary file left


def test_a_worker_does_not_write_over_a_file_holding_more_learning(tmp_path: Path) -> None:
    """Several workers share the file: one that served little (an idle one, still holding the state
    they all started from) does not put that back over what a busier one saved, and a restart takes
    up the busiest one's learning whichever saved last."""
    path = tmp_path / "learned.json"
    _keeper(_taught(), path).save()
    busy, idle = _policy(), _policy()
    busy_keeper, idle_keeper = _keeper(busy, path), _keeper(idle, path)
    assert busy_keeper.load() and idle_keeper.load()
    d = busy.decide(OPEN)
    for _ in range(5):
        busy.observe(Outcome(d, "speculative", "s0", 200, 0.05, 1.0, 180, 30, 150, 210, 30))
    busy_keeper.save()
    idle_keeper.save()  # after the busy one: it would have won
    assert idle_keeper.yielded == 1 and busy_keeper.yielded == 0
    restarted = _policy()
    assert _keeper(restarted, path).load()
    assert restarted.alpha_model.updates == busy.alpha_model.updates == 15
    # the idle one saves again once it has learned more than the file holds
    d = idle.decide(OPEN)
    for _ in range(6):
        idle.observe(Outcome(d, "speculative", "s0", 200, 0.05, 1.0, 180, 30, 150, 210, 30))
    idle_keeper.save()
    assert _keeper(restarted := _policy(), path).load() and restarted.alpha_model.updates == 16
    # a file for another deployment holds nothing this one can use: replaced
    other = _keeper(_policy(), path, HERE.model_copy(update={"num_speculative_tokens": 5}))
    other.save()
    assert other.yielded == 0 and json.loads(path.read_text())["deployment"]["num_speculative_tokens"] == 5


def test_a_save_replaces_the_file_whole(tmp_path: Path) -> None:
    """Written beside it and renamed over it: the file is always one whole state, old or new."""
    path = tmp_path / "learned.json"
    taught = _taught()
    keeper = _keeper(taught, path)
    keeper.save()
    first = path.stat().st_ino
    keeper.save()
    assert path.stat().st_ino != first
    assert [p.name for p in tmp_path.iterdir()] == ["learned.json"]


def test_a_path_that_could_never_be_written_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"routing.state_file: .*does not exist"):
        check_path(tmp_path / "missing" / "learned.json")
    with pytest.raises(ConfigError, match=r"routing.state_file: .* is a directory"):
        check_path(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # reading it at start would block for good
    with pytest.raises(ConfigError, match=r"routing.state_file: .*fifo.json is not a regular file"):
        check_path(fifo)
    fifo.unlink()
    check_path(tmp_path / "learned.json")  # a file yet to be written is fine
    assert list(tmp_path.iterdir()) == []  # and the check left nothing behind
    # the permission bits may say yes where a write fails: root, a special or read-only filesystem
    with pytest.raises(ConfigError, match=r"routing.state_file: .*its directory /proc"):
        check_path(Path("/proc/learned.json"))


def test_the_deployment_is_read_from_the_configuration() -> None:
    config = demo_config(["http://127.0.0.1:1"], ["http://127.0.0.1:2"], 8000, "demo-model")
    settings = load_settings(overrides=config)
    d = deployment(settings)
    assert d.speculative_models == ("demo-model",) and d.slots == SLOTS
    assert d.num_speculative_tokens == settings.pools.speculative.num_speculative_tokens


def test_the_running_gateway_saves_on_its_interval(tmp_path: Path) -> None:
    path = tmp_path / "learned.json"
    keeper = LearnedState(_taught(), path, HERE, interval_s=0.01)

    async def run_a_while() -> None:
        task = asyncio.create_task(keeper.keep())
        await asyncio.sleep(0.2)  # about twenty intervals
        task.cancel()

    asyncio.run(run_a_while())
    assert keeper.saved_at is not None and keeper.save_errors == 0
    assert _keeper(_policy(), path).load()


def test_the_save_at_shutdown_waits_for_a_periodic_one_still_writing(tmp_path: Path) -> None:
    """Cancelling the saving task leaves its thread writing: the last save must still be the newest."""
    path = tmp_path / "learned.json"
    keeper = _keeper(_taught(), path)
    older = keeper.take()
    older.policy.mean_tokens = 1.0
    writing = threading.Event()

    def periodic() -> None:  # the write asyncio.to_thread left running, a little slower than the last save
        with keeper._writing:
            writing.set()
            time.sleep(0.2)
            keeper._write_now(older)

    thread = threading.Thread(target=periodic)
    thread.start()
    writing.wait(10)
    keeper.save()
    thread.join(10)
    saved = json.loads(path.read_text())
    assert saved["policy"]["mean_tokens"] == keeper.policy.mean_tokens != 1.0


def test_a_save_cut_by_a_kill_leaves_no_temporary_file_for_good(tmp_path: Path) -> None:
    """Named by its writer's pid, nothing would reuse it: the next start removes those abandoned a
    while ago, and leaves a sibling worker's write under way alone."""
    path = tmp_path / "learned.json"
    abandoned, writing = tmp_path / ".learned.json.4242.tmp", tmp_path / ".learned.json.4343.tmp"
    for tmp in (abandoned, writing):
        tmp.write_bytes(b'{"format": 1, "sav')
    old = time.time() - 3600
    os.utime(abandoned, (old, old))
    other = tmp_path / ".other.json.4242.tmp"  # another file's: not this one's to remove
    other.write_bytes(b"")
    os.utime(other, (old, old))
    assert not _keeper(_policy(), path).load()  # no file yet
    assert sorted(p.name for p in tmp_path.iterdir()) == [".learned.json.4343.tmp", ".other.json.4242.tmp"]
