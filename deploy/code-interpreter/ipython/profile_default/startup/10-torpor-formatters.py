"""Rich results the E2B SDKs read (loaded by every python kernel of code-interpreter-v1):
``e2b/data`` for pandas DataFrames, ``e2b/chart`` for matplotlib figures (e2b-charts extracts
the chart), ``application/json`` for plain lists and dicts, and PIL images saved to a path
shown as results. The formatters look at ``sys.modules`` first so a cell that never imported
pandas or matplotlib pays nothing for them."""

import sys

import IPython
from IPython.core.formatters import BaseFormatter, JSONFormatter
from traitlets import ObjectName, Unicode


class _FrameData(BaseFormatter):
    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict, str)

    def __call__(self, obj):
        pandas = sys.modules.get("pandas")
        if pandas is None or not isinstance(obj, pandas.DataFrame):
            return super().__call__(obj)
        columns = obj.to_dict(orient="list")
        return {
            name: [v.isoformat() if isinstance(v, pandas.Timestamp) else v for v in values]
            for name, values in columns.items()
        }


class _FigureChart(BaseFormatter):
    format_type = Unicode("e2b/chart")
    print_method = ObjectName("_repr_e2b_chart_")
    _return_type = (dict, str)

    def __call__(self, obj):
        if "matplotlib" not in sys.modules:
            return super().__call__(obj)
        from matplotlib.figure import Figure

        if not isinstance(obj, Figure):
            return super().__call__(obj)
        try:
            from e2b_charts import chart_figure_to_dict

            return chart_figure_to_dict(obj)
        except Exception:  # an unreadable figure still shows as PNG
            return {}


class _PlainJSON(JSONFormatter):
    def __call__(self, obj):
        if isinstance(obj, (list, dict)):
            try:
                import orjson

                flags = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
                return orjson.loads(orjson.dumps(obj, option=flags)), {"expanded": True}
            except TypeError:
                pass
        return super().__call__(obj)


def _install() -> None:
    shell = IPython.get_ipython()
    if shell is None:
        return
    formatters = shell.display_formatter.formatters
    formatters["e2b/data"] = _FrameData(parent=shell.display_formatter)
    formatters["e2b/chart"] = _FigureChart(parent=shell.display_formatter)
    formatters["application/json"] = _PlainJSON(parent=shell.display_formatter)
    try:
        from PIL import Image, ImageShow
    except ImportError:
        return
    # No display in a sandbox: Image.show() would look for a viewer; saving to a path shows
    # the image as a result instead.
    ImageShow.UnixViewer.show_file = lambda self, path, **options: 0
    saving = Image.Image.save

    def save(image, fp, format=None, **params):
        if isinstance(fp, str):
            from IPython.display import display

            display(image)
        return saving(image, fp, format, **params)

    Image.Image.save = save


_install()
del _install
