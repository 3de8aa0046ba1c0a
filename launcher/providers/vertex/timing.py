"""How often the Vertex provider asks, and how long it waits: production defaults, which tests set
near zero through ``LAUNCH_VERTEX_<FIELD>`` and ``launch doctor`` shortens."""

from __future__ import annotations

from dataclasses import dataclass, fields

from launcher.providers.vertex import _gcp
from launcher.status import UsageError


@dataclass(frozen=True)
class Timing:
    """How often to ask, how long to wait. Production defaults; tests set them near zero through
    ``LAUNCH_VERTEX_<FIELD>`` environment variables (``LAUNCH_VERTEX_POLL_S=0`` ...)."""

    #: Least time between two get_custom_job calls for one job (the supervisor loops every 0.2 s).
    poll_s: float = 5.0
    #: Least time between two reads of a job's full log once it has caught up (a read that
    #: found the end); while more is waiting, the read quota alone paces it.
    log_poll_s: float = 3.0
    #: Least time between two reads of a job's event channel: an out-of-memory line is seen at
    #: most this long (and the query's time) after Cloud Logging shows it. At most half the read
    #: quota goes to the channel, whatever this says.
    event_poll_s: float = 2.0
    #: entries.list requests a minute this process sends to one project at most: Cloud Logging's
    #: default read quota is 60, shared by everyone reading the project's logs (lower it when
    #: others read them while jobs run, raise it with the quota). Not seconds.
    log_reads_per_min: float = _gcp.READS_PER_MINUTE
    #: After a job ends, how long its log is still read for entries Cloud Logging has yet to show.
    log_settle_s: float = 20.0
    #: How far back each read starts before the newest entry already read (late entries).
    log_overlap_s: float = 30.0
    #: Each create / get / cancel / list call.
    rpc_timeout_s: float = 30.0
    #: Backoff of retried calls: the first wait, and the most time spent retrying one call.
    retry_initial_s: float = 1.0
    retry_deadline_s: float = 120.0
    #: Reading a job's state (`launch status`, the supervisor's poll): each try, and all tries
    #: together. An endpoint that takes the connection and never answers is one line within
    #: about deadline + timeout (12 s); a follower keeps the last state meanwhile, for at most
    #: ``retry_deadline_s`` since the last answer.
    status_timeout_s: float = 4.0
    status_deadline_s: float = 8.0

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> Timing:
        values: dict[str, float] = {}
        for f in fields(cls):
            raw = environ.get(f"LAUNCH_VERTEX_{f.name.upper()}")
            if raw:
                try:
                    values[f.name] = float(raw)
                except ValueError:
                    raise UsageError(f"LAUNCH_VERTEX_{f.name.upper()}={raw!r} is not a number"
                                     ) from None
        return cls(**values)
