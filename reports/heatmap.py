#!/usr/bin/env python3
"""Draws attention weights as heatmaps, one panel per head, with query and key
labels and a colour bar. Input: a JSON file written by `attn show --heatmap`:
{"title": str, "heads": [{"label": str, "weights": [[...]], "hidden": [[bool]]}]}.
Panels wrap after four heads; the image is exactly
(3.2 * columns + 2.0) x (3.2 * rows + 1.0) inches at 100 dpi, with margins
in inches wide enough for every label (tests/test_reports.py checks that
nothing is drawn outside it)."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def layout(heads):
    columns = min(heads, 4)
    rows = (heads + columns - 1) // columns
    return columns, rows


def figure_size(heads):
    columns, rows = layout(heads)
    return 3.2 * columns + 2.0, 3.2 * rows + 1.0


def draw(spec, out_path, image_format="png"):
    heads = spec["heads"]
    width, height = figure_size(len(heads))
    columns, rows = layout(len(heads))
    fig = plt.figure(figsize=(width, height), dpi=100)
    # Long rows spread their weight thin (about 1/keys each): on a 0-1 scale
    # they are all dark, so beyond 64 keys the scale is logarithmic, from the
    # smallest visible weight to the largest (at most six decades), and the
    # colour bar says so.
    keys = max((len(h["weights"][0]) for h in heads if h["weights"]), default=0)
    logarithmic = keys > 64
    if logarithmic:
        visible = [w for h in heads for row, hidden in zip(h["weights"], h["hidden"])
                   for w, x in zip(row, hidden) if not x and w > 0]
        top = max(visible, default=1.0)
        norm = matplotlib.colors.LogNorm(vmin=max(min(visible, default=1e-6), 1e-6 * top), vmax=top)
    else:
        norm = matplotlib.colors.Normalize(vmin=0.0, vmax=1.0)
    grid = fig.add_gridspec(rows, columns + 1, width_ratios=[3.2] * columns + [0.2], wspace=0.35, hspace=0.45,
                            left=0.75 / width, right=1 - 1.25 / width, top=1 - 0.5 / height,
                            bottom=0.85 / height)
    image = None
    for n, head in enumerate(heads):
        ax = fig.add_subplot(grid[n // columns, n % columns])
        weights = np.ma.masked_array(np.array(head["weights"], dtype=float), mask=np.array(head["hidden"], dtype=bool))
        cmap = matplotlib.colormaps["viridis"].copy()
        cmap.set_bad("#d9d9d9")  # hidden keys in grey
        rows, cols = weights.shape
        image = ax.imshow(weights, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
        step_r, step_c = max(1, rows // 8), max(1, cols // 6)
        ax.set_yticks(range(0, rows, step_r), [f"q{i}" for i in range(0, rows, step_r)], fontsize=7)
        ax.set_xticks(range(0, cols, step_c), [f"k{j}" for j in range(0, cols, step_c)], fontsize=7, rotation=45,
                      ha="right")
        ax.set_xlabel("key")
        if n % columns == 0:
            ax.set_ylabel("query")
        ax.set_title(head["label"], fontsize=9)
    colorbar = fig.add_subplot(grid[:, columns])
    fig.colorbar(image, cax=colorbar, label="weight (log scale)" if logarithmic else "weight")
    fig.suptitle(spec.get("title", "attention weights"), fontsize=10)
    fig.savefig(out_path, dpi=100, format=image_format)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: heatmap.py WEIGHTS.json OUT [png|svg|pdf]")
    with open(sys.argv[1]) as f:
        draw(json.load(f), sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else "png")
