"""Run by every Python kernel of Warren's code-interpreter template at start (IPython exec_files).

Registers two extra display formats the e2b_code_interpreter SDKs read from a result:
  e2b/data   a pandas DataFrame as {column: [values]}          -> Result.data
  e2b/chart  a matplotlib Figure's plotted data, by chart type  -> Result.chart (LineChart, BarChart, ...)
Both look only at objects whose library the user already imported, so `1 + 1` costs nothing extra.
"""

import math
import sys

from IPython import get_ipython
from IPython.core.formatters import BaseFormatter
from traitlets import ObjectName, Unicode


def _number(value):
    """A float for JSON (NaN and infinities become None)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) or math.isinf(number) else number


def _jsonable(value):
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(value, pandas.Timestamp):
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalars
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, (int, str, bool)) or value is None:
        return value
    return str(value)


class DataFrameFormatter(BaseFormatter):
    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict,)

    def __call__(self, obj):
        pandas = sys.modules.get("pandas")
        if pandas is None or not isinstance(obj, pandas.DataFrame):
            return super().__call__(obj)
        columns = obj.to_dict(orient="list")
        return {str(name): [_jsonable(v) for v in values] for name, values in columns.items()}


# --- charts -------------------------------------------------------------------------------------------


def _ticks(axis_getter_ticks, axis_getter_labels):
    ticks = [_jsonable(t) for t in axis_getter_ticks()]
    labels = [label.get_text() for label in axis_getter_labels()]
    return ticks, labels


def _unit(label):
    """'Temperature (°C)' -> '°C', as a unit is usually written in an axis label."""
    if label.endswith(")") and "(" in label:
        return label[label.rindex("(") + 1 : -1]
    if label.endswith("]") and "[" in label:
        return label[label.rindex("[") + 1 : -1]
    return None


def _axes_2d(ax):
    x_label, y_label = ax.get_xlabel(), ax.get_ylabel()
    return {
        "title": ax.get_title(),
        "x_label": x_label or None,
        "y_label": y_label or None,
        "x_unit": _unit(x_label),
        "y_unit": _unit(y_label),
    }


def _point_chart(ax, kind, elements):
    x_ticks, x_tick_labels = _ticks(ax.get_xticks, ax.get_xticklabels)
    y_ticks, y_tick_labels = _ticks(ax.get_yticks, ax.get_yticklabels)
    return {
        "type": kind,
        **_axes_2d(ax),
        "x_ticks": x_ticks,
        "x_tick_labels": x_tick_labels,
        "x_scale": ax.get_xscale(),
        "y_ticks": y_ticks,
        "y_tick_labels": y_tick_labels,
        "y_scale": ax.get_yscale(),
        "elements": elements,
    }


def _series_label(artist, index):
    label = artist.get_label() or ""
    return f"series {index}" if not label or label.startswith("_") else label


def _axes_chart(ax):
    """The chart one Axes shows, or None when it has nothing this extractor knows."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        labels = [t.get_text() for t in ax.texts]
        elements = []
        for i, wedge in enumerate(wedges):
            label = wedge.get_label() or (labels[i] if i < len(labels) else f"slice {i}")
            elements.append({"label": label, "angle": _number(wedge.theta2 - wedge.theta1), "radius": _number(wedge.r)})
        return {"type": "pie", "title": ax.get_title(), "elements": elements}

    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        tick_labels = [t.get_text() for t in ax.get_xticklabels()]
        tick_positions = list(ax.get_xticks())
        elements = []
        for index, container in enumerate(bars):
            group = container.get_label() or ""
            group = f"group {index}" if not group or group.startswith("_") else group
            for rect in container.patches:
                center = rect.get_x() + rect.get_width() / 2
                label = str(_jsonable(center))
                for position, text in zip(tick_positions, tick_labels):
                    if text and abs(position - center) < rect.get_width():
                        label = text
                        break
                elements.append({"label": label, "group": group, "value": _number(rect.get_height())})
        return {"type": "bar", **_axes_2d(ax), "elements": elements}

    boxes = _box_elements(ax)
    if boxes:
        return {"type": "box_and_whisker", **_axes_2d(ax), "elements": boxes}

    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    if scatters:
        elements = [
            {"label": _series_label(c, i), "points": [[_number(x), _number(y)] for x, y in c.get_offsets()]}
            for i, c in enumerate(scatters)
        ]
        return _point_chart(ax, "scatter", elements)

    lines = [line for line in ax.get_lines() if len(line.get_xdata()) > 0]
    if lines:
        elements = [
            {
                "label": _series_label(line, i),
                "points": [[_jsonable(x), _number(y)] for x, y in zip(line.get_xdata(), line.get_ydata())],
            }
            for i, line in enumerate(lines)
        ]
        return _point_chart(ax, "line", elements)
    return None


def _box_elements(ax):
    """Box plots, from the statistics `Axes.bxp` was given (see _remember_boxplot_stats); [] if none."""
    stats = getattr(ax, "_warren_boxplot_stats", None)
    if not stats:
        return []
    labels = [t.get_text() for t in ax.get_xticklabels()]
    elements = []
    for i, s in enumerate(stats):
        elements.append(
            {
                "label": s.get("label") or (labels[i] if i < len(labels) else f"box {i}"),
                "min": _number(s["whislo"]),
                "first_quartile": _number(s["q1"]),
                "median": _number(s["med"]),
                "third_quartile": _number(s["q3"]),
                "max": _number(s["whishi"]),
                "outliers": [_number(v) for v in s.get("fliers", [])],
            }
        )
    return elements


def figure_chart(figure):
    charts = [c for c in (_axes_chart(ax) for ax in figure.get_axes()) if c is not None]
    if not charts:
        return {}
    if len(charts) == 1:
        return charts[0]
    title = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) is not None else ""
    return {"type": "superchart", "title": title, "elements": charts}


class ChartFormatter(BaseFormatter):
    format_type = Unicode("e2b/chart")
    print_method = ObjectName("_repr_e2b_chart_")
    _return_type = (dict,)

    def __call__(self, obj):
        if sys.modules.get("matplotlib") is None:
            return super().__call__(obj)
        from matplotlib.figure import Figure

        if not isinstance(obj, Figure):
            return super().__call__(obj)
        try:
            return figure_chart(obj) or None
        except Exception:  # a figure this extractor does not understand still shows as PNG
            return None


def _remember_boxplot_stats():
    """Keeps the statistics `Axes.boxplot` computed on the Axes, so the chart carries the real quartiles
    rather than numbers read back from drawn lines. Imports matplotlib.axes (not pyplot, no backend) at
    kernel start: the template's checkpoint holds it warm."""
    from matplotlib.axes import Axes

    if getattr(Axes.bxp, "_warren_wrapped", False):
        return
    original = Axes.bxp

    def bxp(self, bxpstats, *args, **kwargs):
        self._warren_boxplot_stats = [dict(s) for s in bxpstats]
        return original(self, bxpstats, *args, **kwargs)

    bxp._warren_wrapped = True
    Axes.bxp = bxp


def _install():
    shell = get_ipython()
    if shell is None:
        return
    formatter = shell.display_formatter
    for extra in (DataFrameFormatter(parent=formatter), ChartFormatter(parent=formatter)):
        formatter.formatters[extra.format_type] = extra
    try:
        _remember_boxplot_stats()
    except ImportError:  # no matplotlib in this environment: no box plots to remember
        pass


_install()
del _install
