"""What the scripts/plot_*.py figures share: matplotlib without a display, one colour per policy,
and SVG output that stays text (labels are <text>, searchable and diffable) and byte-stable between
runs of the same data (no date, fixed element ids), so a regenerated figure only changes where its
data did."""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICY_COLORS = {"full": "#555555", "lychee": "#d62728", "tidal": "#1f77b4", "quest": "#2ca02c", "duo": "#9467bd",
                 "hf sdpa": "#ff7f0e"}
EXTRA_COLORS = ["#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#000000"]

plt.rcParams.update({
    "svg.fonttype": "none",      # text as <text>, not glyph paths
    "svg.hashsalt": "lychee",    # element ids from a fixed salt: the same data gives the same file
    "font.family": "sans-serif",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.grid": True,
    "grid.color": "#e5e5e5",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
})


def save(fig, path):
    """Writes the figure as SVG or PNG (by the file's extension) without a timestamp, and closes it."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".svg", ".png"):
        raise SystemExit(f"{path}: the figure is written as .svg or .png, not '{ext or 'no extension'}'")
    meta = {"Date": None} if ext == ".svg" else {}
    fig.savefig(path, bbox_inches="tight", dpi=150, metadata=meta, facecolor="white")
    plt.close(fig)
