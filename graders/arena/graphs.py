"""A graph drawn as a picture: the `Graph.print_tabular` table that a failing check's sentence carries
(graders/run/structure.py before_after) turned into an SVG, one box per node, top to bottom, an arrow from
each node to every node that uses it. No drawing library: the SVG is written here, every text escaped.

May import: the standard library.
"""
from __future__ import annotations

import html
import re

BEFORE, AFTER = "Graph before the pass:", "Graph after the pass:"
ROW, BOX_W, LEFT = 34, 360, 12


def split_message(message: str) -> tuple[str, str | None, str | None]:
    """(the sentence, the table before, the table after); the tables are None when the message has none."""
    if BEFORE not in message:
        return message, None, None
    sentence, _, rest = message.partition(BEFORE)
    before, _, after = rest.partition(AFTER)
    return sentence.strip(), before.strip("\n"), after.strip("\n") if after else None


def parse_table(table: str) -> list[dict]:
    """The rows of a print_tabular table: opcode, name, target, args, kwargs (columns from the dashes line)."""
    lines = table.splitlines()
    dashes = next((i for i, line in enumerate(lines) if re.fullmatch(r"[- ]+", line) and "-" in line), None)
    if dashes is None or dashes == 0:
        return []
    spans = [m.span() for m in re.finditer(r"-+", lines[dashes])]
    keys = [lines[dashes - 1][a:b].strip() or f"col{n}" for n, (a, b) in enumerate(spans)]
    rows = []
    for line in lines[dashes + 1:]:
        if not line.strip():
            break
        cells = [line[a:(spans[n + 1][0] if n + 1 < len(spans) else len(line))].strip() for n, (a, _) in enumerate(spans)]
        rows.append(dict(zip(keys, cells)))
    return rows


def svg(table: str, title: str) -> str:
    """The graph as an SVG element (a short note instead when the table cannot be read)."""
    rows = parse_table(table)
    if not rows:
        return f'<pre class="graph">{html.escape(table)}</pre>'
    index = {row.get("name", ""): n for n, row in enumerate(rows)}
    edges = []
    for n, row in enumerate(rows):
        used = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", f"{row.get('args', '')} {row.get('kwargs', '')}")
        edges += [(index[u], n) for u in dict.fromkeys(used) if u in index and index[u] != n]
    height, width = ROW * len(rows) + 40, BOX_W + LEFT + 40 + 14 * len(edges)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title, quote=True)}">',
             f'<text x="{LEFT}" y="16" font-weight="bold">{html.escape(title)}</text>']
    for k, (a, b) in enumerate(edges):
        y1, y2 = 26 + a * ROW + 22, 26 + b * ROW + 4
        if b == a + 1:
            parts.append(f'<line x1="{LEFT + BOX_W // 2}" y1="{y1}" x2="{LEFT + BOX_W // 2}" y2="{y2}" '
                         'stroke="#555" marker-end="url(#arrow)"/>')
        else:
            x = LEFT + BOX_W + 14 + 14 * k
            parts.append(f'<path d="M{LEFT + BOX_W} {y1 - 11} H{x} V{y2 + 11} H{LEFT + BOX_W}" fill="none" '
                         'stroke="#888" marker-end="url(#arrow)"/>')
    for n, row in enumerate(rows):
        y = 26 + n * ROW
        op, name, target = row.get("opcode", ""), row.get("name", ""), row.get("target", "")
        fill = {"placeholder": "#e8f0fe", "output": "#e6f4ea", "get_attr": "#fef7e0"}.get(op, "#f1f3f4")
        target = re.sub(r"^<built-in (?:method|function) (\w+).*>$", r"\1", target)
        label = name if target in ("", name) else f"{name} = {target}"
        parts.append(f'<rect x="{LEFT}" y="{y}" width="{BOX_W}" height="22" rx="4" fill="{fill}" stroke="#444"/>'
                     f'<text x="{LEFT + 6}" y="{y + 15}" font-family="monospace" font-size="12">'
                     f'{html.escape(op)}: {html.escape(label[:48])}</text>')
    parts.insert(1, '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
                    'orient="auto"><path d="M0 0 L10 5 L0 10 z" fill="#555"/></marker></defs>')
    parts.append("</svg>")
    return "".join(parts)
