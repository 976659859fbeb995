"""Knobs: a paper's hyper-parameters as controls, live in Jupyter and static in the HTML book.

A chapter describes its knobs and a function that draws a figure for one setting of them:

    panel = knob_panel(draw, [Knob("temperature", (0.1, 0.5, 1.0, 2.0), default=1.0),
                              Knob("hard", (False, True))])
    panel   # the last expression of a cell: shows the panel

Shown in a notebook, the panel is one output that carries two views of the same knobs:

- a live view (`application/vnd.jupyter.widget-view+json`): ipywidgets controls in Jupyter,
  Colab or VS Code; moving one calls `draw(**values)` again and redraws;
- a static view (`text/html`): `draw` evaluated once at every point of the knobs' grid, each
  figure stored as a PNG, with a small slider in plain JavaScript (papernotes/static/knobs.js,
  inlined, so the output is self-contained: no CDN, no require.js) that swaps the picture.
  The HTML book shows this view; its `_config.yml` drops the widget view for the html builder.

A knob that retrains is expensive: `precompute(train, knobs)` runs the sweep once and caches it,
and `draw` only looks results up, so both views stay quick.

A value outside a knob's range, or of the wrong type, raises ValueError naming the knob and what
it allows: no silent clamping.
"""

from __future__ import annotations

import base64
import hashlib
import html
import itertools
import json
import math
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from papernotes import plotting
from papernotes.training import progress

Figure = Any  # a matplotlib Figure; kept loose to avoid importing pyplot here
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MAX_FRAMES = 48  # a panel's frames are stored in the notebook: 48 keep a chapter under 400 KB


@dataclass(frozen=True)
class Knob:
    """One hyper-parameter: its name, the grid of values the controls step through, a default.

    The kind follows from the values: booleans (a checkbox), numbers (a slider; any number in
    [min, max] is accepted when `draw` is called directly) or names (a choice).
    """

    name: str
    values: tuple
    default: Any = None
    label: str | None = None

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"knob name must be a Python identifier; got {self.name!r}")
        values = tuple(self.values)
        if not values:
            raise ValueError(f"knob {self.name!r} needs at least one value")
        kind = _kind_of(self.name, values)
        if kind == "bool":
            values = (False, True)  # the checkbox's order, whatever order was given
        elif kind == "number" and list(values) != sorted(values):
            raise ValueError(f"knob {self.name!r}: numeric values must be increasing; got {values}")
        if len(set(values)) != len(values):
            raise ValueError(f"knob {self.name!r}: values repeat; got {values}")
        default = values[len(values) // 2] if self.default is None else self.default
        if default not in values:
            raise ValueError(
                f"knob {self.name!r}: default {default!r} is not one of its values {values}"
            )
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "default", default)
        object.__setattr__(self, "label", self.label or self.name.replace("_", " "))

    @property
    def kind(self) -> str:
        return _kind_of(self.name, self.values)

    def allowed(self) -> str:
        """The allowed values, in words, for error messages."""
        if self.kind == "bool":
            return "True or False"
        if self.kind == "number":
            return f"a number in [{_fmt(self.values[0])}, {_fmt(self.values[-1])}]"
        return "one of " + ", ".join(repr(v) for v in self.values)

    def check(self, value):
        """Return `value` if the knob allows it, else raise ValueError naming the knob."""
        ok = {
            "bool": lambda v: isinstance(v, bool),
            "number": lambda v: _is_number(v) and self.values[0] <= v <= self.values[-1],
            "choice": lambda v: isinstance(v, str) and v in self.values,
        }[self.kind](value)
        if not ok:
            raise ValueError(f"knob {self.name!r} must be {self.allowed()}; got {value!r}")
        return value

    def index(self, value) -> int:
        """Position of `value` on the grid; ValueError if it is not a grid point."""
        self.check(value)
        for i, v in enumerate(self.values):
            if v == value:
                return i
        grid = ", ".join(_fmt(v) for v in self.values)
        raise ValueError(f"knob {self.name!r} was precomputed only at {grid}; got {value!r}")


def check_values(knobs: Sequence[Knob], values: Mapping[str, Any]) -> dict[str, Any]:
    """Fill in defaults and check every value; unknown knob names are an error too."""
    names = [k.name for k in knobs]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"unknown knob(s) {', '.join(unknown)}; the knobs are {', '.join(names)}")
    return {k.name: k.check(values[k.name]) if k.name in values else k.default for k in knobs}


def grid(knobs: Sequence[Knob]) -> Iterator[dict[str, Any]]:
    """Every combination of the knobs' values, the last knob varying fastest."""
    for combo in itertools.product(*(k.values for k in knobs)):
        yield dict(zip((k.name for k in knobs), combo, strict=True))


# -- expensive knobs: a sweep computed once ----------------------------------------------------


class Sweep(Mapping):
    """Results of an expensive function at every grid point of some knobs, computed once.

    `sweep.at(lr=5)` looks a result up by knob values (checked against the grid);
    as a Mapping it is keyed by tuples of values in knob order.
    """

    def __init__(self, knobs: Sequence[Knob], results: Mapping[tuple, Any]):
        self.knobs = tuple(knobs)
        self._results = dict(results)

    def at(self, **values):
        values = check_values(self.knobs, values)
        for knob in self.knobs:
            knob.index(values[knob.name])  # off-grid values were never computed: say so
        return self._results[tuple(values[k.name] for k in self.knobs)]

    def __getitem__(self, key):
        return self._results[key]

    def __iter__(self):
        return iter(self._results)

    def __len__(self):
        return len(self._results)


def precompute(fn: Callable[..., Any], knobs: Sequence[Knob], desc: str = "sweep") -> Sweep:
    """Run `fn(**values)` at every grid point of `knobs` once, in grid order."""
    _check_unique_names(knobs)
    points = list(grid(knobs))
    results = {tuple(p.values()): fn(**p) for p in progress(points, desc=desc)}
    return Sweep(knobs, results)


# -- the panel ----------------------------------------------------------------------------------


class KnobPanel:
    """A figure-drawing function and its knobs, shown live (ipywidgets) and static (HTML/JS)."""

    def __init__(self, draw: Callable[..., Figure], knobs: Sequence[Knob], title: str = ""):
        _check_unique_names(knobs)
        if not knobs:
            raise ValueError("a knob panel needs at least one knob")
        n_frames = math.prod(len(k.values) for k in knobs)
        if n_frames > MAX_FRAMES:
            sizes = " x ".join(f"{len(k.values)} {k.name}" for k in knobs)
            raise ValueError(
                f"a knob panel stores one figure per grid point and allows at most {MAX_FRAMES}; "
                f"these knobs make {sizes} = {n_frames}: give some knob fewer values"
            )
        self.draw = draw
        self.knobs = tuple(knobs)
        self.title = title
        self._frames: list[str] | None = None
        self._widget = None

    def figure(self, **values) -> Figure:
        """Draw the figure for these knob values (defaults for the rest), checked first."""
        return self.draw(**check_values(self.knobs, values))

    def png(self, **values) -> bytes:
        fig = self.figure(**values)
        try:
            return plotting.figure_png(fig)
        finally:
            plotting.close(fig)

    # -- static view ------------------------------------------------------------------------------

    def frames(self) -> list[str]:
        """Base64 PNGs of every grid point, in grid order (computed once)."""
        if self._frames is None:
            points = list(grid(self.knobs))
            self._frames = [
                base64.b64encode(self.png(**p)).decode("ascii")
                for p in progress(points, desc="knob frames")
            ]
        return self._frames

    def static_html(self) -> str:
        """The self-contained static panel: controls, the default frame in the <img>, the other
        frames as data (each stored once: the default's slot in the data is null), the JS."""
        frames = self.frames()
        default_index = _flat_index(self.knobs, [k.values.index(k.default) for k in self.knobs])
        data = {
            "sizes": [len(k.values) for k in self.knobs],
            "labels": [[_fmt(v) for v in k.values] for k in self.knobs],
            "names": [k.label for k in self.knobs],
            "frames": [None if i == default_index else f for i, f in enumerate(frames)],
        }
        panel_id = "pn-knobs-" + hashlib.sha1("".join(frames).encode()).hexdigest()[:10]
        controls = "".join(_static_control(i, k) for i, k in enumerate(self.knobs))
        title = f'<div class="pn-knob-title">{html.escape(self.title)}</div>' if self.title else ""
        return (
            f'<div class="pn-knobs" id="{panel_id}">{title}'
            f'<div class="pn-knob-controls">{controls}</div>'
            f'<img class="pn-knob-frame" alt="{html.escape(_alt(self.knobs, self.title))}" '
            f'src="data:image/png;base64,{frames[default_index]}">'
            f'<script type="application/json" class="pn-knob-data">{json.dumps(data)}</script>'
            f"<script>{_knobs_js()}</script></div>"
        )

    # -- live view --------------------------------------------------------------------------------

    def widget(self):
        """The live ipywidgets panel (built once); moving a control redraws the figure."""
        if self._widget is None:
            self._widget = _live_widget(self)
        return self._widget

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {
            "text/plain": f"Knob panel ({', '.join(k.name for k in self.knobs)}): live in Jupyter, "
            "a static slider in the HTML book",
            "text/html": self.static_html(),
        }
        try:
            live = self.widget()
        except ImportError:
            return bundle  # no ipywidgets: the static view still works in a notebook with JS
        bundle.update(_widget_view(live))
        return bundle


def knob_panel(draw: Callable[..., Figure], knobs: Sequence[Knob], title: str = "") -> KnobPanel:
    """A panel of knobs over `draw(**values) -> Figure`; display it to show both views."""
    return KnobPanel(draw, knobs, title)


# -- helpers --------------------------------------------------------------------------------------


def _live_widget(panel: KnobPanel):
    try:
        import ipywidgets as widgets
        from IPython.display import Image, display
    except ImportError as error:
        raise ImportError(
            "live knobs need ipywidgets (pip install ipywidgets); the static panel works without it"
        ) from error

    controls = {k.name: _live_control(widgets, k) for k in panel.knobs}
    output = widgets.Output()

    def show(png: bytes) -> None:
        with output:
            output.clear_output(wait=True)
            display(Image(data=png, format="png"))

    def redraw(_change=None) -> None:
        show(panel.png(**{name: control.value for name, control in controls.items()}))

    for control in controls.values():
        control.observe(redraw, names="value")
    # The first picture is the static view's default frame: no need to draw it twice.
    default_index = _flat_index(panel.knobs, [k.values.index(k.default) for k in panel.knobs])
    show(base64.b64decode(panel.frames()[default_index]))
    box = widgets.VBox([widgets.HBox(list(controls.values())), output])
    box.redraw = redraw  # for tests and for readers who change a control from code
    box.controls = controls
    return box


def _widget_view(widget) -> dict:
    """The widget-view part of a widget's display bundle.

    ipywidgets 8 builds it in `_repr_mimebundle_`; ipywidgets 7 (still Colab's default) has no
    such method, so the view, version 2.0 of the widget-view format, is written out here.
    """
    if hasattr(widget, "_repr_mimebundle_"):
        bundle = widget._repr_mimebundle_() or {}
        return {k: v for k, v in bundle.items() if k != "text/plain"}
    return {WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}}


def _live_control(widgets, knob: Knob):
    # The whole label, never ipywidgets' default cut ("temperat..."), as in the static panel.
    labelled = {"description": knob.label, "style": {"description_width": "initial"}}
    if knob.kind == "bool":
        return widgets.Checkbox(value=knob.default, indent=False, **labelled)
    if knob.kind == "number":
        return widgets.SelectionSlider(
            options=[(_fmt(v), v) for v in knob.values],
            value=knob.default,
            continuous_update=False,
            **labelled,
        )
    return widgets.ToggleButtons(options=list(knob.values), value=knob.default, **labelled)


def _static_control(index: int, knob: Knob) -> str:
    label = html.escape(knob.label)
    position = knob.values.index(knob.default)
    if knob.kind == "bool":
        checked = " checked" if knob.default else ""
        control = f'<input type="checkbox" data-knob-control="{index}"{checked}>'
    else:
        control = (
            f'<input type="range" min="0" max="{len(knob.values) - 1}" step="1" '
            f'value="{position}" data-knob-control="{index}" aria-label="{label}">'
        )
    readout = html.escape(_fmt(knob.default))
    return (
        f'<label class="pn-knob">{label} {control} '
        f'<output data-knob-readout="{index}">{readout}</output></label>'
    )


@cache
def _knobs_js() -> str:
    return resources.files("papernotes").joinpath("static/knobs.js").read_text()


def _flat_index(knobs: Sequence[Knob], positions: Sequence[int]) -> int:
    index = 0
    for knob, position in zip(knobs, positions, strict=True):
        index = index * len(knob.values) + position
    return index


def _alt(knobs: Sequence[Knob], title: str) -> str:
    return (title or "figure") + " for " + ", ".join(k.label for k in knobs)


def _check_unique_names(knobs: Sequence[Knob]) -> None:
    names = [k.name for k in knobs]
    if len(set(names)) != len(names):
        raise ValueError(f"knob names repeat: {names}")


def _kind_of(name: str, values: tuple) -> str:
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(_is_number(v) for v in values):
        return "number"
    if all(isinstance(v, str) for v in values):
        return "choice"
    raise ValueError(
        f"knob {name!r}: values must be all booleans, all numbers or all names; got {values}"
    )


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
