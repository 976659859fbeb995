"""The shared plot helpers."""

import matplotlib.pyplot as plt
import numpy as np
import pytest

from papernotes import plotting


def test_simplex_corners_map_to_the_triangle():
    xy = plotting.simplex_xy(np.eye(3))
    assert np.allclose(xy, [[0, 0], [1, 0], [0.5, np.sqrt(3) / 2]])
    assert np.allclose(plotting.simplex_xy([[1 / 3, 1 / 3, 1 / 3]]), [[0.5, np.sqrt(3) / 6]])
    with pytest.raises(ValueError, match=r"shape \(N, 3\)"):
        plotting.simplex_xy(np.ones((2, 4)))


def test_power_of_ten_labels_are_plain_text():
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    plotting.power_of_ten_labels(ax)
    formatter = ax.yaxis.get_major_formatter()
    assert (
        formatter(1e-3, 0) == "10⁻³" and formatter(100.0, 0) == "10²" and formatter(1.0, 0) == "10⁰"
    )
    with pytest.raises(ValueError, match="axis"):
        plotting.power_of_ten_labels(ax, "z")
    plt.close(fig)


def test_figure_png_is_stable_and_unstamped():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    first, second = plotting.figure_png(fig), plotting.figure_png(fig)
    plt.close(fig)
    assert first.startswith(b"\x89PNG") and first == second
    assert b"Matplotlib version" not in first
    assert first[25] == 3  # colour type 3: a palette image, a third of the RGBA size


def test_palette_pngs_keep_the_plot():
    import io

    from PIL import Image

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0], color="#d62728", linewidth=4)
    png = plotting.figure_png(fig)
    plt.close(fig)
    with Image.open(io.BytesIO(png)) as image:
        colours = {rgb for _, rgb in image.convert("RGB").getcolors(maxcolors=4096)}
        assert len(colours) <= plotting.PNG_COLOURS
    assert (214, 39, 40) in colours and (255, 255, 255) in colours
