"""Line charts as inline SVG, drawn on the server: no script, nothing fetched.

The runs pages plot validation score per round, one line per run, starting at the seed's
score (the val evaluation before round 0). Labels are escaped; colours are presentation
attributes, so the page's content security policy (no inline styles or scripts) holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@dataclass
class Series:
    label: str
    points: list[tuple[int, float]]  # (x index into the chart's x labels, y)
    bands: list[tuple[int, float, float]] = field(default_factory=list)  # (x, low, high)


def line_chart(series: Sequence[Series], x_labels: Sequence[str], title: str,
               y_label: str = "", width: int = 640, height: int = 260) -> Markup:
    """An SVG chart; y spans [0, 1] unless a value falls outside. Missing points are gaps."""
    legend_rows = max(1, (len(series) + 3) // 4)
    height += 14 * (legend_rows - 1)
    left, right, top, bottom = 48, 40, 28, 30 + 14 * legend_rows
    pw, ph = width - left - right, height - top - bottom
    ys = [y for s in series for _, y in s.points] + [v for s in series for _, lo, hi in s.bands
                                                      for v in (lo, hi)]
    lo = min([0.0, *ys])
    hi = max([1.0, *ys])
    n = max(len(x_labels), 2)

    def px(x: float) -> float:
        return left + pw * x / (n - 1)

    def py(y: float) -> float:
        return top + ph * (1 - (y - lo) / (hi - lo or 1.0))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
           f'<text x="{left}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>']
    for k in range(5):  # horizontal grid and y ticks
        y = lo + (hi - lo) * k / 4
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(y):.1f}" y2="{py(y):.1f}" '
                   f'stroke="#ddd"/><text x="{left - 6}" y="{py(y) + 4:.1f}" font-size="11" '
                   f'text-anchor="end">{y:.2f}</text>')
    for i, lab in enumerate(x_labels):
        out.append(f'<text x="{px(i):.1f}" y="{top + ph + 16}" font-size="11" '
                   f'text-anchor="middle">{escape(lab)}</text>')
    if y_label:
        out.append(f'<text x="12" y="{top + ph / 2:.1f}" font-size="11" text-anchor="middle" '
                   f'transform="rotate(-90 12 {top + ph / 2:.1f})">{escape(y_label)}</text>')
    for k, s in enumerate(series):
        colour = PALETTE[k % len(PALETTE)]
        for x, b_lo, b_hi in s.bands:
            out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{py(b_lo):.1f}" '
                       f'y2="{py(b_hi):.1f}" stroke="{colour}" stroke-opacity="0.35" stroke-width="6"/>')
        pts = sorted(s.points)
        for a, b in zip(pts, pts[1:]):
            if b[0] == a[0] + 1:  # a gap where a round has no score
                out.append(f'<line x1="{px(a[0]):.1f}" y1="{py(a[1]):.1f}" x2="{px(b[0]):.1f}" '
                           f'y2="{py(b[1]):.1f}" stroke="{colour}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}">'
                       f'<title>{escape(s.label)}: {escape(x_labels[x])} {y:.3f}</title></circle>')
        lx = left + 8 + 150 * (k % 4)
        ly = top + ph + 32 + 14 * (k // 4)
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{lx + 14}" y="{ly}" font-size="11">{escape(s.label[:22])}</text>')
    if not any(s.points for s in series):
        out.append(f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" '
                   f'font-size="12" fill="#888">no validation scores recorded</text>')
    out.append("</svg>")
    return Markup("".join(out))
