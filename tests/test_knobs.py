"""Knobs: definitions, validation, the static HTML/JS view, the live ipywidgets view, sweeps."""

import base64
import json
import re

import matplotlib.pyplot as plt
import pytest

import papernotes as pn
from papernotes.knobs import Knob, check_values, grid

TEMPERATURE = Knob("temperature", (0.1, 0.5, 1.0, 2.0), default=1.0, label="temperature τ")
HARD = Knob("hard", (True, False))
ACTIVATION = Knob("activation", ("sigmoid", "relu"), default="relu")


def draw_recorder():
    calls = []

    def draw(**values):
        calls.append(values)
        fig, ax = plt.subplots(figsize=(2, 1.5))
        ax.plot([0, 1], [0, values.get("temperature", 1)], linewidth=1 + 3 * values.get("hard", 0))
        ax.set_title(f"{values}")
        return fig

    return draw, calls


# -- definitions ----------------------------------------------------------------------------------


def test_kinds_defaults_and_labels():
    assert TEMPERATURE.kind == "number" and TEMPERATURE.default == 1.0
    assert HARD.kind == "bool" and HARD.values == (False, True) and HARD.default is True
    assert ACTIVATION.kind == "choice"
    assert Knob("lr_multiplier", (1, 5, 30)).default == 5  # the middle value
    assert Knob("lr_multiplier", (1, 5, 30)).label == "lr multiplier"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "t", "values": ()}, "at least one value"),
        ({"name": "t", "values": (1.0, 0.5)}, "increasing"),
        ({"name": "t", "values": (0.5, 1.0), "default": 0.7}, "not one of its values"),
        ({"name": "t", "values": (1, "a")}, "all booleans, all numbers or all names"),
        ({"name": "t", "values": ("a", "a")}, "repeat"),
        ({"name": "not a name", "values": (1,)}, "identifier"),
    ],
)
def test_bad_knob_definitions_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Knob(**kwargs)


# -- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("knob", "value", "allowed"),
    [
        (TEMPERATURE, 7.0, r"a number in \[0.1, 2\]"),
        (TEMPERATURE, -0.1, r"a number in \[0.1, 2\]"),
        (TEMPERATURE, float("nan"), "a number"),
        (TEMPERATURE, "1.0", "a number"),
        (TEMPERATURE, True, "a number"),
        (HARD, 1, "True or False"),
        (HARD, "yes", "True or False"),
        (ACTIVATION, "tanh", "one of 'sigmoid', 'relu'"),
    ],
)
def test_values_outside_a_knob_raise_naming_the_knob_and_its_range(knob, value, allowed):
    with pytest.raises(ValueError, match=rf"knob '{knob.name}' must be {allowed}"):
        knob.check(value)


def test_values_inside_the_range_pass_unchanged():
    assert TEMPERATURE.check(0.37) == 0.37  # off-grid but in range: fine for a direct call
    assert HARD.check(False) is False
    assert ACTIVATION.check("sigmoid") == "sigmoid"


def test_check_values_fills_defaults_and_rejects_unknown_knobs():
    assert check_values([TEMPERATURE, HARD], {"hard": False}) == {"temperature": 1.0, "hard": False}
    with pytest.raises(ValueError, match="unknown knob.*tempreature.*the knobs are temperature"):
        check_values([TEMPERATURE], {"tempreature": 1.0})


def test_grid_runs_the_last_knob_fastest():
    points = list(grid([Knob("a", (1, 2)), HARD]))
    assert points == [
        {"a": 1, "hard": False},
        {"a": 1, "hard": True},
        {"a": 2, "hard": False},
        {"a": 2, "hard": True},
    ]


# -- the panel: static view -----------------------------------------------------------------------


def static_data(html):
    match = re.search(r'<script type="application/json" class="pn-knob-data">(.*?)</script>', html)
    return json.loads(match.group(1))


def test_static_view_holds_one_distinct_frame_per_grid_point():
    draw, calls = draw_recorder()
    panel = pn.knob_panel(draw, [TEMPERATURE, HARD], title="demo")
    html = panel.static_html()
    data = static_data(html)
    assert data["sizes"] == [4, 2]
    assert data["labels"] == [["0.1", "0.5", "1", "2"], ["False", "True"]]
    assert len(data["frames"]) == 8 == len(calls)
    default_index = 2 * 2 + 1  # temperature 1.0 is position 2 of 4; hard=True is position 1
    assert data["frames"][default_index] is None  # stored once, as the <img> itself
    stored = [f for f in data["frames"] if f is not None]
    assert len(set(stored)) == 7  # every other setting draws a different picture
    for frame in stored:
        png = base64.b64decode(frame)
        assert png.startswith(b"\x89PNG") and png[25] == 3  # colour type 3: a palette image
    assert calls[5] == {"temperature": 1.0, "hard": True}  # grid order matches the JS's index


def test_static_view_shows_the_default_frame_and_controls_at_the_default():
    draw, _ = draw_recorder()
    panel = pn.knob_panel(draw, [TEMPERATURE, HARD])
    html = panel.static_html()
    default_index = 2 * 2 + 1  # temperature 1.0 is position 2 of 4; hard=True is position 1
    default_png = base64.b64encode(panel.png(temperature=1.0, hard=True)).decode()
    assert panel.frames()[default_index] == default_png
    assert f'src="data:image/png;base64,{default_png}"' in html
    assert default_png not in html.split("pn-knob-data")[1]  # not a second time in the data
    assert 'type="range" min="0" max="3" step="1" value="2"' in html
    assert 'type="checkbox" data-knob-control="1" checked' in html
    assert "document.currentScript" in html  # the inlined JS travels with the panel
    assert "http" not in html.split("<script>")[1]  # and loads nothing


def test_frames_are_drawn_once_and_the_html_is_stable():
    draw, calls = draw_recorder()
    panel = pn.knob_panel(draw, [TEMPERATURE])
    assert panel.static_html() == panel.static_html()
    assert len(calls) == 4


def test_panel_figure_validates_its_knobs():
    draw, calls = draw_recorder()
    panel = pn.knob_panel(draw, [TEMPERATURE, HARD])
    message = r"knob 'temperature' must be a number in \[0.1, 2\]; got 9"
    with pytest.raises(ValueError, match=message):
        panel.figure(temperature=9)
    with pytest.raises(ValueError, match="unknown knob"):
        panel.figure(temprature=1.0)
    assert calls == []


def test_a_panel_refuses_more_than_48_frames():
    knobs = [Knob("a", tuple(range(7))), Knob("b", tuple(range(7)))]
    with pytest.raises(ValueError, match=r"at most 48; these knobs make 7 a x 7 b = 49"):
        pn.knob_panel(lambda **v: None, knobs)
    pn.knob_panel(lambda **v: None, [Knob("a", tuple(range(6))), Knob("b", tuple(range(8)))])


def test_a_panel_needs_distinct_knobs():
    with pytest.raises(ValueError, match="repeat"):
        pn.knob_panel(lambda **v: None, [TEMPERATURE, TEMPERATURE])
    with pytest.raises(ValueError, match="at least one knob"):
        pn.knob_panel(lambda **v: None, [])


# -- the panel: live view -------------------------------------------------------------------------


def test_live_view_redraws_when_a_control_moves():
    draw, calls = draw_recorder()
    panel = pn.knob_panel(draw, [TEMPERATURE, HARD])
    box = panel.widget()
    n_static = len(calls)  # the static frames; the first live picture reuses one of them
    assert n_static == 8
    box.controls["temperature"].value = 0.5
    assert calls[-1] == {"temperature": 0.5, "hard": True}
    box.controls["hard"].value = False
    assert calls[-1] == {"temperature": 0.5, "hard": False}
    assert len(calls) == n_static + 2  # recomputed live, once per move


def test_live_controls_match_the_knob_kinds():
    import ipywidgets as widgets

    panel = pn.knob_panel(lambda **v: plt.figure(), [TEMPERATURE, HARD, ACTIVATION])
    controls = panel.widget().controls
    assert isinstance(controls["temperature"], widgets.SelectionSlider)
    assert [value for _, value in controls["temperature"].options] == [0.1, 0.5, 1.0, 2.0]
    assert isinstance(controls["hard"], widgets.Checkbox)
    assert isinstance(controls["activation"], widgets.ToggleButtons)
    for control in controls.values():  # labels shown whole, never cut to "temperat..."
        assert control.style.description_width == "initial"
        assert control.description


def test_displayed_panel_carries_both_views():
    draw, _ = draw_recorder()
    bundle = pn.knob_panel(draw, [HARD])._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/html"].startswith('<div class="pn-knobs"')
    assert "live in Jupyter" in bundle["text/plain"]


def test_the_widget_view_is_written_out_for_ipywidgets_7():
    # ipywidgets 7 (Colab's default) widgets have no _repr_mimebundle_; the view is built here
    # in the same format that ipywidgets 8 produces.
    from types import SimpleNamespace

    from papernotes.knobs import WIDGET_VIEW, _widget_view

    legacy = _widget_view(SimpleNamespace(model_id="abc123"))
    assert legacy == {WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": "abc123"}}
    box = pn.knob_panel(draw_recorder()[0], [HARD]).widget()
    modern = _widget_view(box)[WIDGET_VIEW]
    assert (modern["version_major"], modern["model_id"]) == (2, box.model_id)


def test_without_ipywidgets_the_static_view_remains(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ipywidgets(name, *args, **kwargs):
        if name == "ipywidgets":
            raise ImportError("No module named 'ipywidgets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ipywidgets)
    draw, _ = draw_recorder()
    panel = pn.knob_panel(draw, [HARD])
    bundle = panel._repr_mimebundle_()
    assert "text/html" in bundle and "application/vnd.jupyter.widget-view+json" not in bundle
    with pytest.raises(ImportError, match="live knobs need ipywidgets"):
        panel.widget()


# -- expensive knobs: sweeps ----------------------------------------------------------------------


def test_precompute_runs_once_per_grid_point_and_looks_results_up():
    calls = []

    def train(lr, bn):
        calls.append((lr, bn))
        return lr * (10 if bn else 1)

    sweep = pn.precompute(train, [Knob("lr", (1, 5, 30)), Knob("bn", (False, True))])
    assert len(calls) == 6 and len(sweep) == 6
    assert sweep.at(lr=30, bn=True) == 300
    assert sweep.at(bn=False) == 5  # lr at its default
    assert sweep[(1, True)] == 10
    assert len(calls) == 6  # lookups never recompute


def test_sweep_lookups_off_the_grid_say_where_it_was_computed():
    sweep = pn.precompute(lambda lr: lr, [Knob("lr", (1, 5, 30))])
    with pytest.raises(ValueError, match="knob 'lr' was precomputed only at 1, 5, 30; got 7"):
        sweep.at(lr=7)
    with pytest.raises(ValueError, match=r"must be a number in \[1, 30\]"):
        sweep.at(lr=100)
