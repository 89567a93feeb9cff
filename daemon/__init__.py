"""The trainer process runtime: ``kelp train``'s daemon, its I/O pipeline, health endpoints and lifecycle.

Importable without the command line (``kelp.cli`` starts it; benchmarks and
tests drive :class:`~kelp.daemon.train.TrainDaemon` directly). Modules:
:mod:`~kelp.daemon.train` (lifecycle, drain, checkpoints, publishing),
:mod:`~kelp.daemon.pipeline` (one step: the pull plan, prefetch, overlay, write-behind),
:mod:`~kelp.daemon.stages` (the prefetch and push threads, commit after durable),
:mod:`~kelp.daemon.ledger` (the in-flight overlay),
:mod:`~kelp.daemon.progress_report` (log lines, learning record, AUC gauges), :mod:`~kelp.daemon.outage`
(riding out a store outage), :mod:`~kelp.daemon.health` (``/healthz``,
``/readyz``, ``/metrics``), :mod:`~kelp.daemon.preflight` (what ``kelp train``
and ``kelp config validate`` refuse before starting).
"""

__all__: list[str] = []
