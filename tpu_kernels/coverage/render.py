"""The report as text, markdown, HTML (sortable, with the chart inlined) and a PNG chart."""
from __future__ import annotations

import base64
import html
import io

from tpu_kernels.coverage.targets import EXTRA_TIERS, IMPL_KINDS, ORDER, TIERS

def totals_line(rep: dict) -> str:
    t = rep["totals"]
    pct = 100 * t["targets_covered"] / max(t["targets"], 1)
    tiers = ", ".join(f"tier {k} {v['covered']}/{v['total']}" for k, v in sorted(t["tiers"].items())
                      if k not in EXTRA_TIERS)
    kk = t["kernels_by_kind"]
    p = t["parity"]
    par = ("no parity run recorded" if not p["recorded"] else
           f"parity {p['passed']}/{p['tested']} ops pass ({100 * p['rate']:.0f}%)" if p["tested"]
           else "parity: no op tested")
    return (f"coverage: {t['targets_covered']}/{t['targets']} target overloads ({pct:.1f}%; {tiers}); "
            f"{t['custom_ops']} custom ops, {t.get('higher_order_ops', 0)} higher-order ops; "
            f"impls: pallas {kk['pallas']}, helion {kk['helion']}, "
            f"user {kk['user']}, xla {kk['xla']}; {par}; gap {t['gap']}")


def filter_rows(rows: list[dict], tier: str | None = None, kind: str | None = None,
                missing: bool = False, op: str | None = None) -> list[dict]:
    out = rows
    if tier:
        tiers = {t.strip() for t in str(tier).split(",")}
        out = [r for r in out if r["tier"] in tiers]
    if kind:
        kinds = {k.strip() for k in kind.split(",")}
        out = [r for r in out if kinds & (set(r["kinds"]) | {r["best"]})]
    if missing:
        out = [r for r in out if not r["covered"]]
    if op:
        out = [r for r in out if op in r["op"]]
    return out


def _impls_text(r: dict) -> str:
    kinds = sorted(r["kinds"], key=ORDER.index)
    return " ".join(f"{k}" + (f"x{len(r['kinds'][k])}" if len(r["kinds"][k]) > 1 and k in IMPL_KINDS else "")
                    for k in kinds) or "-"


_TCOLS = (("op", 48), ("tier", 6), ("impls", 16), ("pick (here)", 26), ("pick (TPU)", 26),
          ("parity", 13), ("compiles on", 23), ("won by (cost model)", 40), ("speed", 0))


def format_text(rep: dict, rows: list[dict]) -> str:
    lines = [totals_line(rep), ""]
    for k, t in sorted(rep["totals"]["tiers"].items()):
        kinds = ", ".join(f"{kk} {n}" for kk, n in t["by_kind"].items() if n)
        lines.append(f"  tier {k:<7} {t['covered']:>4}/{t['total']:<4} covered  ({kinds})")
    lines.append("")
    for f in rep["files"].values():
        lines.append(f["text"])
    lines += ["", " ".join(f"{n:<{w}}" for n, w in _TCOLS).rstrip()]
    lines.append("-" * 160)
    for r in rows:
        cells = [r["op"][:48], r["tier"], _impls_text(r)[:16], r["pick"][:26], r["pick_tpu"][:26],
                 r["parity"][:13], r["export"][:23], r.get("won_by", "-")[:40], r["speed"]]
        lines.append(" ".join(f"{c:<{w}}" for c, (_, w) in zip(cells, _TCOLS)).rstrip())
    lines.append(f"\n{len(rows)} rows")
    lines += never_win_lines(rep)
    return "\n".join(lines)


def format_markdown(rep: dict, rows: list[dict]) -> str:
    out = [f"**{totals_line(rep)}**", ""]
    out += [f"- {f['text']}" for f in rep["files"].values()] + [""]
    out.append("| tier | covered | " + " | ".join(ORDER) + " |")
    out.append("|---|---|" + "---|" * len(ORDER))
    for k, t in sorted(rep["totals"]["tiers"].items()):
        out.append(f"| {k} | {t['covered']}/{t['total']} | " + " | ".join(str(t["by_kind"][x]) for x in ORDER) + " |")
    out += ["", "| op | tier | impls | pick (here) | pick (TPU) | parity | compiles on (real TPU compile) "
                "| won by (cost model) | speed |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"`{r['op']}`", r["tier"], _impls_text(r), r["pick"], r["pick_tpu"], r["parity"],
                 r["export"], r.get("won_by", "-"), r["speed"]]
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out + ["", *never_win_lines(rep)]) + "\n"


def never_win_lines(rep: dict) -> list[str]:
    """The kernels the cost model picks on no chip (when ``--won-by`` asked it)."""
    never = rep.get("never_win")
    if never is None:
        return []
    return [f"kernels that never win (cost model, production shapes): {', '.join(never) or 'none'}"]


_JS = """
function sortBy(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th),
asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';const b=t.tBodies[0];
const rows=[...b.rows].sort((x,y)=>{const a=x.cells[i].innerText,c=y.cells[i].innerText,
n=parseFloat(a),m=parseFloat(c);const r=(!isNaN(n)&&!isNaN(m))?n-m:a.localeCompare(c);return asc?r:-r;});
rows.forEach(r=>b.appendChild(r));}
function filt(v){for(const r of document.querySelectorAll('#ops tbody tr'))
r.style.display=r.innerText.toLowerCase().includes(v.toLowerCase())?'':'none';}
"""


def format_html(rep: dict, rows: list[dict]) -> str:
    png = chart_png(rep)
    e = html.escape
    head = "".join(f"<th onclick='sortBy(this)'>{e(n)}</th>" for n in
                   ("op", "tier", "impls", "pick (here)", "pick (TPU)", "parity", "compiles on", "won by",
                    "speed"))
    body = []
    for r in rows:
        cls = "miss" if not r["covered"] else ""
        cells = [r["op"], r["tier"], _impls_text(r), r["pick"], r["pick_tpu"], r["parity"], r["export"],
                 r.get("won_by", "-"), r["speed"]]
        titles = {5: e(r.get("parity_detail", "")), 6: e(r.get("export_detail", ""))}
        body.append(f"<tr class='{cls}'>" + "".join(
            f"<td title='{titles[j]}'>{e(str(c))}</td>" if j in titles else f"<td>{e(str(c))}</td>"
            for j, c in enumerate(cells)) + "</tr>")
    files = "".join(f"<li>{e(f['text'])}</li>" for f in rep["files"].values())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>tpu_kernels coverage</title>
<style>body{{font:13px sans-serif;margin:1em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px}}th{{cursor:pointer;background:#eee;position:sticky;top:0}}
tr.miss td{{background:#fdd}}</style><script>{_JS}</script></head><body>
<h1>tpu_kernels op coverage</h1><p><b>{e(totals_line(rep))}</b></p><p>generated {e(rep['date'])}</p>
<ul>{files}</ul>
<img alt="coverage by tier and impl kind" src="data:image/png;base64,{base64.b64encode(png).decode()}">
<p>filter: <input oninput="filt(this.value)"> (click a column header to sort)</p>
<table id="ops"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>
{''.join(f"<p>{e(line)}</p>" for line in never_win_lines(rep))}</body></html>
"""


_COLORS = {"user": "#9467bd", "pallas": "#d62728", "helion": "#ff7f0e", "xla": "#1f77b4",
           "runtime": "#17becf", "decomp": "#bcbd22", "none": "#cccccc"}


_TIER_LABELS = {"custom": "custom ops", "hop": "higher-order ops"}


def chart_png(rep: dict) -> bytes:
    """Stacked bars: per tier, overloads by the best impl kind they have."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tiers = [k for k in TIERS if k in rep["totals"]["tiers"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0] * len(tiers)
    for kind in ORDER:
        vals = [rep["totals"]["tiers"][t]["by_kind"][kind] for t in tiers]
        ax.bar([_TIER_LABELS.get(t, f"tier {t}") for t in tiers], vals, bottom=bottom,
               label=kind, color=_COLORS[kind])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("op overloads")
    ax.set_title(f"tpu_kernels coverage by tier and impl kind ({rep['date'][:10]})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()
