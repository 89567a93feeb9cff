"""PNG figures for people: learning curves of a run (``kelp report``), ``kelp bench accuracy`` and
the Grafana dashboard's preview (``kelp dashboard preview``: :mod:`.scrape` records ``/metrics``,
:mod:`.dashboard` reads the dashboard JSON, :mod:`.promql_eval` evaluates its queries with
promtool, :mod:`.dashboard_preview` pairs panels with results, :mod:`.dashboard_figure` draws).

matplotlib is an optional dependency (``pip install 'kelp[plots]'``, part of
``.[dev]``): the trainer and serving never import this room, so a production
image need not carry it.
"""

from kelp.plots.curves import Curve, curve_from_logits
from kelp.plots.figures import plot_accuracy, plot_admission, plot_learning

__all__ = ["Curve", "curve_from_logits", "plot_accuracy", "plot_admission", "plot_learning"]
