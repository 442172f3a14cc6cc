"""What routing has learned, kept in a file across restarts (``routing.state_file``).

Why: the per-request acceptance model, the per-kind estimates, the speedup model's step costs and the
pools' residence times are learned from live requests. Without this file a restarted gateway (a
deploy, a drained node, a crash) starts again from the classifier's prior and spends its first few
hundred requests exploring what it knew a minute before.

The file is written every ``routing.state_save_interval_s`` seconds and when the gateway stops, to a
temporary file beside it renamed over it, so a reader never sees half of one; it is read once, at
start. Time counts while the gateway is down: the acceptance model's certainty fades and the per-kind
evidence decays over the gap as they would in a gateway that ran and measured nothing (the learned
means stay, as they do while running), so a state saved long ago is taken up as a starting point to
check, not as a certainty.

A file is not taken up, with a warning saying why, when it cannot be read or parsed, or when it was
written for another deployment: another feature scheme or number of hashed slots (what a weight
means), or a speculative pool with other models, ``num_speculative_tokens`` or ``draft_cost_ratio``.
The gateway then starts from the prior, and the next save replaces the file. What is not learning is
not kept: load, in-flight counts, the outlier detector's view of each endpoint, decision counters.

With several workers (``server.workers``) each learns from the requests it serves and writes the same
file, but not over a file that holds more learning than its own (more measurements: a sibling that
served more of the traffic). So an idle worker does not put back, every interval, the older state it
started from, and a restart keeps what the busiest worker learned (the others' is lost: two online
models cannot be merged into one) rather than whichever wrote last. Every worker starts from the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.config import ConfigError, Settings
from gateway.observability import Metrics
from gateway.routing.adaptive import AdaptivePolicy, PolicyState
from gateway.routing.features import SCHEME, SLOTS

log = logging.getLogger("specroute.routing")

#: seconds after which a save's temporary file is taken for one whose writer died
ABANDONED_S = 60.0


class Deployment(BaseModel):
    """What learned weights and step costs hold for: a file written for another is not taken up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    feature_scheme: int
    slots: int
    speculative_models: tuple[str, ...]
    num_speculative_tokens: int | None
    draft_cost_ratio: float | None


class LearnedFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    format: Literal[1]  # bumped when the layout changes: an older file is then refused
    saved_at: float  # wall-clock seconds since the epoch
    deployment: Deployment
    policy: PolicyState


def deployment(settings: Settings) -> Deployment:
    spec = settings.pools.speculative
    return Deployment(
        feature_scheme=SCHEME,
        slots=SLOTS,
        speculative_models=tuple(sorted(spec.models)),
        num_speculative_tokens=spec.num_speculative_tokens,
        draft_cost_ratio=spec.draft_cost_ratio,
    )


def check_path(path: Path) -> None:
    """Raise :class:`ConfigError` when ``path`` could never be written, before the gateway serves."""
    where = f"routing.state_file: {path}"
    if path.is_dir():
        raise ConfigError(f"{where} is a directory")
    if path.exists() and not path.is_file():
        # a FIFO or a device: reading it at start would block for good, deaf to SIGTERM
        raise ConfigError(f"{where} is not a regular file")
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(f"{where}: its directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}: its directory {parent} is not writable")
    if path.exists() and not os.access(path, os.R_OK):
        raise ConfigError(f"{where} is not readable")
    # os.access answers for the permission bits only: root may write anywhere by them, and a special
    # or read-only filesystem (/proc, a read-only mount) says yes and refuses the write. A save writes a
    # file beside the state's and renames it over: try the first half of that
    probe = parent / f".{path.name}.{os.getpid()}.probe"
    try:
        probe.open("wb").close()
    except OSError as e:
        raise ConfigError(f"{where}: cannot write in its directory {parent} ({e.strerror or e})") from None
    probe.unlink(missing_ok=True)


@dataclass
class LearnedState:
    """Keeps one policy's learning in one file: :meth:`load` at start, :meth:`keep` while running,
    :meth:`save` at the end."""

    policy: AdaptivePolicy
    path: Path
    deployment: Deployment
    interval_s: float = 60.0
    restored: str = "not yet read"  # what start-up made of the file, for /admin/routing
    saved_at: float | None = None  # wall clock of the last save
    save_errors: int = 0
    last_error: str | None = None
    yielded: int = 0  # saves not made: the file held more learning (another worker's)
    metrics: Metrics | None = None
    # one write at a time: the save at shutdown waits for a periodic one still running in its thread
    # (cancelling the task does not stop the thread), so the newer state is the one left on disk
    _writing: threading.Lock = field(default_factory=threading.Lock)

    def load(self) -> bool:
        """Take up the file's learning; False (with a warning, unless there is no file yet) if not."""
        self._sweep()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.restored = "no file yet: starting from the prior"
            log.info("routing.state_file %s: %s", self.path, self.restored)
            return False
        except OSError as e:
            return self._refuse(f"cannot read it ({e.strerror or e})")
        try:
            data = LearnedFile.model_validate_json(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"][:4]) or "the file"
            return self._refuse(f"not a state file this gateway writes ({where}: {first['msg']})")
        if data.deployment != self.deployment:
            changed = [
                name
                for name in Deployment.model_fields
                if getattr(data.deployment, name) != getattr(self.deployment, name)
            ]
            return self._refuse(f"written for another deployment ({', '.join(changed)} changed)")
        down_s = max(0.0, time.time() - data.saved_at)
        self.policy.restore(data.policy, down_s)
        self.restored = (
            f"restored {data.policy.acceptance.updates} acceptance updates saved {down_s:.0f} s before start"
        )
        log.info("routing.state_file %s: %s", self.path, self.restored)
        return True

    def _sweep(self) -> None:
        """Remove the temporary files of saves that never finished (a process killed while it wrote:
        each is named by its writer's pid, so nothing would reuse or remove it, and a crash-looping
        pod would pile them up on its volume). A save takes milliseconds: one older than
        :data:`ABANDONED_S` is no live sibling's."""
        now = time.time()
        for tmp in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                if now - tmp.stat().st_mtime > ABANDONED_S:
                    tmp.unlink()

    def _refuse(self, why: str) -> bool:
        self.restored = f"not taken up: {why}; starting from the prior"
        log.warning("routing.state_file %s: %s", self.path, self.restored)
        return False

    def take(self) -> LearnedFile:
        """The policy's learning as it is now: a copy, taken on the event loop between two requests."""
        return LearnedFile(
            format=1, saved_at=time.time(), deployment=self.deployment, policy=self.policy.state()
        )

    def save(self) -> None:
        """Write the file now; a failure is logged and counted, never raised (routing goes on)."""
        self._write(self.take())

    def _write(self, learned: LearnedFile) -> None:
        with self._writing:
            self._write_now(learned)

    def _write_now(self, learned: LearnedFile) -> None:
        on_disk = self._evidence_on_disk()
        if on_disk is not None and on_disk > learned.policy.evidence:
            self.yielded += 1
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            data = learned.model_dump_json().encode()
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            self.save_errors += 1
            if self.metrics is not None:
                self.metrics.state_save_errors.inc()
            self.last_error = f"{e.strerror or e}"
            log.warning("routing.state_file %s: cannot write it (%s)", self.path, self.last_error)
            tmp.unlink(missing_ok=True)
            return
        self.saved_at = time.time()
        self.last_error = None

    def _evidence_on_disk(self) -> int | None:
        """The measurements the file holds, when it is one for this deployment (else None: any save
        may replace it)."""
        try:
            data = LearnedFile.model_validate(orjson.loads(self.path.read_bytes()))
        except (OSError, orjson.JSONDecodeError, ValidationError):
            return None
        return data.policy.evidence if data.deployment == self.deployment else None

    async def keep(self) -> None:
        """Save every ``interval_s`` until cancelled; the writing happens off the event loop."""
        while True:
            await asyncio.sleep(self.interval_s)
            await asyncio.to_thread(self._write, self.take())

    def snapshot(self) -> dict[str, object]:
        return {
            "file": str(self.path),
            "at_start": self.restored,
            "saved_at": self.saved_at,
            "save_interval_s": self.interval_s,
            "save_errors": self.save_errors,
            "last_error": self.last_error,
            "saves_yielded": self.yielded,
        }
