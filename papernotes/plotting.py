"""One plot style for the whole book, and the few drawing helpers that chapters share.

Every figure in the book has a title, labelled axes with units, and the same fonts and colours.
Colours are named by role (ours, the baseline, the paper's number), so that a method keeps its
colour from one chapter to the next.
"""

from __future__ import annotations

import io

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

PALETTE = {
    "ours": "#1f77b4",  # the method the chapter is about
    "baseline": "#d62728",  # the ablation or baseline it is compared with
    "alternative": "#2ca02c",  # a third variant (straight-through, LSTM, ...)
    "paper": "#7f7f7f",  # the paper's reported number
    "accent": "#ff7f0e",
    "muted": "#9467bd",
}

STYLE = {
    "figure.figsize": (7.0, 3.4),
    "figure.dpi": 100,
    "savefig.dpi": 80,
    "savefig.bbox": "tight",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": mpl.cycler(color=list(PALETTE.values())),
    "image.cmap": "viridis",
}


def apply_style() -> None:
    """Apply the book's style to matplotlib's global settings."""
    mpl.rcParams.update(STYLE)


_SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_of_ten_labels(ax, axis: str = "y") -> None:
    """Label a log-scale axis 10⁻³, 10⁻², ... in plain text.

    matplotlib's default labels for log axes are typeset as TeX, which about doubles the time to
    draw a figure: that adds up over the dozens of frames of a static knob panel.
    """
    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y'; got {axis!r}")
    formatter = mpl.ticker.FuncFormatter(
        lambda value, _: "10" + str(round(np.log10(value))).translate(_SUPERSCRIPTS)
    )
    getattr(ax, f"{axis}axis").set_major_formatter(formatter)
    ax.tick_params(axis=axis, labelsize=11)  # superscript digits read small at the default size


PNG_COLOURS = 64


def figure_png(fig) -> bytes:
    """The figure as a palette PNG of at most `PNG_COLOURS` colours, with no software version
    stamped in (the same bytes run after run).

    A plot has few colours, so the palette image looks the same as matplotlib's RGBA PNG and
    is about a third of its size: that keeps a chapter with a knob panel of dozens of frames
    under the book's 400 KB budget.
    """
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    buffer.seek(0)
    with Image.open(buffer) as rgba:
        rgb = Image.new("RGB", rgba.size, "white")
        rgb.paste(rgba, mask=rgba.getchannel("A"))
    palette = rgb.quantize(colors=PNG_COLOURS, method=Image.Quantize.MEDIANCUT, dither=0)
    out = io.BytesIO()
    palette.save(out, format="png", optimize=True)
    return out.getvalue()


def close(fig) -> None:
    plt.close(fig)


# The probability simplex in three categories, drawn as an equilateral triangle.
_TRIANGLE = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3) / 2]])


def simplex_xy(points: np.ndarray) -> np.ndarray:
    """Map points of the 3-category simplex, shape (N, 3), to 2-D triangle coordinates (N, 2)."""
    points = np.asarray(points, dtype=float)
    if points.ndim != 2 or points.shape[1] != 3:
        raise ValueError(f"simplex points must have shape (N, 3); got {points.shape}")
    return points @ _TRIANGLE


def draw_simplex(ax, labels=("1", "2", "3")) -> None:
    """Outline the triangle, label its corners and hide the axes."""
    corners = np.vstack([_TRIANGLE, _TRIANGLE[:1]])
    ax.plot(corners[:, 0], corners[:, 1], color="black", linewidth=0.8)
    offsets = [(-0.06, -0.05), (0.02, -0.05), (-0.02, 0.03)]
    for (x, y), (dx, dy), label in zip(_TRIANGLE, offsets, labels, strict=True):
        ax.text(x + dx, y + dy, label, fontsize=9)
    ax.set_aspect("equal")
    ax.set_xlim(-0.1, 1.1)
    ax.set_ylim(-0.1, 0.95)
    ax.axis("off")
