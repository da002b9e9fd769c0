"""Prometheus metrics of one service process: lookups counted here, jobs and trials read at scrape.

Each app gets its own registry, so several apps (tests, an embedded worker) never clash on the
global one. Jobs and trials come from the database when scraped: the embedded worker runs in a
child process (worker_process.py) and other workers on other hosts, so a counter kept in this
process would miss their work; the database sees every worker's.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kernelsearch.db.statuses import FINISHED_STATUSES, JOB_STATUSES

log = logging.getLogger(__name__)

# Lookups are answered from memory in well under a millisecond; misses go to the database.
_LOOKUP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                   1.0)


class _StoreCollector(Collector):
    """Jobs by status, finished jobs and trials, read from the store at scrape time."""

    def __init__(self, count_jobs: Callable[[str], int], count_trials: Callable[[], int] | None) -> None:
        self._count_jobs = count_jobs
        self._count_trials = count_trials

    def collect(self) -> Iterable[Metric]:
        g = GaugeMetricFamily("ks_jobs", "Jobs in the database by status", labels=["status"])
        finished = CounterMetricFamily("ks_jobs_finished", "Jobs finished, by every worker",
                                       labels=["status"])
        trials = CounterMetricFamily("ks_trials", "Trials finished by tuning jobs, by every worker")
        up = GaugeMetricFamily("ks_database_up", "1 when the last scrape reached the database")
        try:
            counts = [(s, self._count_jobs(s)) for s in JOB_STATUSES]
            n_trials = self._count_trials() if self._count_trials is not None else 0
        except Exception as exc:  # a scrape must still answer while the database is down
            log.warning("metrics: cannot count jobs and trials: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        for status, n in counts:
            g.add_metric([status], float(n))
            if status in FINISHED_STATUSES:
                finished.add_metric([status], float(n))
        trials.add_metric([], float(n_trials))
        up.add_metric([], 1.0)
        yield from (g, finished, trials, up)


class Metrics:
    """The metrics one app (and its embedded worker) updates."""

    def __init__(self, count_jobs: Callable[[str], int] | None = None,
                 count_trials: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.lookups = Counter("ks_lookups", "Best-config lookups by how they matched",
                               ["match"], registry=self.registry)
        self.lookup_seconds = Histogram("ks_lookup_seconds", "Time to answer GET /v1/best",
                                        buckets=_LOOKUP_BUCKETS, registry=self.registry)
        self.record_cache = Counter("ks_best_cache", "GET /v1/best answers by cache outcome",
                                    ["outcome"], registry=self.registry)
        if count_jobs is not None:
            self.registry.register(_StoreCollector(count_jobs, count_trials))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def count_lookup(self, match: str, seconds: float) -> None:
        self.lookups.labels(match).inc()
        self.lookup_seconds.observe(seconds)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> Any:
        """A sample's value from the registry (for tests and the dashboard)."""
        return self.registry.get_sample_value(name, labels or {})
