"""Turn one results file into plots and a documentation page: ``docs/benchmarks.md`` for CPU.

    python -m benchmarks.report [benchmarks/results/cpu.json]

One page per device type (:func:`page_for`): ``benchmarks/results/cpu.json`` becomes
``docs/benchmarks.md``, ``benchmarks/results/cuda.json`` becomes ``docs/benchmarks_cuda.md``.
Everything on a page comes from its single file, so every ratio on it was measured on one
machine in one run. Plots go to ``docs/images/benchmarks/`` (``.../<type>/`` for other devices;
skipped, with a note, when matplotlib is not installed: ``pip install -e .[bench]``).

The page's words are in ``benchmarks/templates/benchmarks_page.md.j2`` (Jinja2); this module picks
the figures of each table (laid out by ``tabulate``) and judges each goal (:func:`verdict`, with the
median's interval from ``scipy.stats``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
from scipy import stats
from tabulate import tabulate

from benchmarks.common import RESULTS_DIR, ROOT, SCHEMA, results_for

DOCS_PAGE = ROOT / "docs" / "benchmarks.md"
IMAGES_DIR = ROOT / "docs" / "images" / "benchmarks"
TEMPLATE = Path(__file__).with_name("templates") / "benchmarks_page.md.j2"


def page_for(device_type: str) -> tuple[Path, Path]:
    """(docs page, plot folder) of a device type's results: CPU's is the main benchmarks page.

    >>> [p.name for p in page_for("cuda")]
    ['benchmarks_cuda.md', 'cuda']
    """
    if device_type == "cpu":
        return DOCS_PAGE, IMAGES_DIR
    return DOCS_PAGE.with_name(f"benchmarks_{device_type}.md"), IMAGES_DIR / device_type


def _other_pages(device_type: str) -> list[str]:
    """Links to the pages of the other device types that have a results file."""
    links = []
    for path in sorted(RESULTS_DIR.glob("*.json")):
        other = path.stem
        if other == device_type or not page_for(other)[0].exists():
            continue
        try:
            meta = json.loads(path.read_text())["meta"]
        except (ValueError, KeyError):
            continue
        title = "CPU" if other == "cpu" else f"`{other}`"
        links.append(f"[{title}: {meta['device']['name']}, {meta['date'][:10]}]({page_for(other)[0].name})")
    return links


STRATEGY_VARIANTS = {"plugin": "plugin", "lightning": "Lightning's own", "raw": "plain PyTorch", "single": "1 process",
                     "raw+sigterm_broadcast": "plain PyTorch + Lightning's per-step broadcast"}
FAMILY_LABELS = {"ddp": "DDP", "fsdp": "FSDP", "fsdp2": "FSDP2", "deepspeed": "DeepSpeed ZeRO-2"}
SECTION_NAMES = ("overhead", "transformer", "strategies", "collective", "first_step", "device_calls")
VARIANT_LABELS = {"plugin": "AnyAccelerator (plugin)", "builtin": "Lightning built-in", "plain": "plain PyTorch loop",
                  "plugin+profiler": "AnyAccelerator + profiler=\"pytorch\""}
PHASE_LABELS = {"import": "import", "launch_rendezvous": "launch + rendezvous", "first_step": "first step"}


def size(nbytes: float) -> str:
    """A byte count in MiB, KiB or B, three significant digits."""
    for unit, factor in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            return f"{nbytes / factor:.3g} {unit}"
    return f"{nbytes:g} B"


def pct(x: float | None) -> str:
    """A fraction as a whole percentage."""
    return "n/a" if x is None else f"{100 * x:.0f} %"


def spread(s: dict[str, Any], fmt: str = "{:.3f}") -> str:
    """A summary as ``median [min–max]``."""
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}–{fmt.format(s['max'])}]"


# ----------------------------------------------------------------------------------------------
# plots


def _plots(doc: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """Write one PNG per section that has data; return section -> file name."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    device = doc["meta"]["device"]
    tag = f"{device['type']} ({device['name']}), {doc['meta']['date'][:10]}"
    made: dict[str, str] = {}

    ov = doc.get("overhead", {})
    if "steps_per_s" in ov:
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        names = list(ov["steps_per_s"])
        data = [ov["steps_per_s"][n]["values"] for n in names]
        try:
            ax.boxplot(data, orientation="horizontal", widths=0.5)  # matplotlib >= 3.10
        except TypeError:
            ax.boxplot(data, vert=False, widths=0.5)
        for i, vals in enumerate(data, start=1):
            ax.plot(vals, [i] * len(vals), "o", alpha=0.5, color="C0")
        ax.set_yticks(range(1, len(names) + 1), [VARIANT_LABELS.get(n, n) for n in names])
        ax.set_xlabel("training steps / s (higher is better)")
        ax.set_title(f"Plugin overhead, one device\n{tag}", fontsize=9)
        made["overhead"] = _save(fig, out_dir / "overhead.png")

    st = doc.get("strategies", {})
    fams = {f: r for f, r in st.get("families", {}).items() if r.get("steps_per_s")}
    if fams:
        fig, ax = plt.subplots(figsize=(6.8, 0.5 + 0.9 * len(fams)))
        labels, med, lo, hi, colors = [], [], [], [], []
        for f, r in fams.items():
            for i, n in enumerate(v for v in ("plugin", "lightning", "raw") if v in r["steps_per_s"]):
                s_ = r["steps_per_s"][n]
                labels.append(f"{FAMILY_LABELS.get(f, f)} — {STRATEGY_VARIANTS[n]}")
                med.append(s_["median"])
                lo.append(s_["median"] - s_["min"])
                hi.append(s_["max"] - s_["median"])
                colors.append(f"C{('plugin', 'lightning', 'raw').index(n)}")
        y = list(range(len(labels)))[::-1]
        ax.barh(y, med, xerr=[lo, hi], color=colors, capsize=3)
        ax.set_yticks(y, labels, fontsize=7)
        procs = st.get("settings", {}).get("processes", 2)
        ax.set_xlabel(f"training steps / s, {procs} process{'es' if procs > 1 else ''}"
                      " (median, min–max over rounds; higher is better)")
        ax.set_title(f"Strategies side by side\n{tag}", fontsize=9)
        made["strategies"] = _save(fig, out_dir / "strategies.png")

    co = doc.get("collective", {})
    if co.get("memcpy"):
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        if co.get("all_reduce"):
            rows = co["all_reduce"]
            ax.plot([r["bytes"] for r in rows], [r["busbw_gbps"] for r in rows], "o-",
                    label=f"all_reduce busbw ({co.get('backend')}, {co['settings']['world_size']} processes)")
        rows = co["memcpy"]
        ax.plot([r["bytes"] for r in rows], [r["gbps"] for r in rows], "s--", label="memcpy on one device")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: size(x)))
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("GB/s")
        ax.legend(fontsize=8)
        ax.set_title(f"Collective bandwidth\n{tag}", fontsize=9)
        made["collective"] = _save(fig, out_dir / "collective.png")

    fs = doc.get("first_step", {})
    if fs.get("seconds"):
        fig, ax = plt.subplots(figsize=(6.4, 2.8))
        methods = list(fs["seconds"])
        left = [0.0] * len(methods)
        for i, phase in enumerate(fs["phases"]):
            widths = [fs["seconds"][m][phase]["median"] for m in methods]
            ax.barh(methods, widths, left=left, label=PHASE_LABELS.get(phase, phase), color=f"C{i}")
            left = [a + b for a, b in zip(left, widths)]
        ax.set_xlabel("seconds from interpreter start to the end of the first step (median)")
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title(f"Time to first step, DDP\n{tag}", fontsize=9)
        made["first_step"] = _save(fig, out_dir / "first_step.png")
    return made


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # every title and label inside the image
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name


# ----------------------------------------------------------------------------------------------
# statistics and verdicts


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of ``values``: (low, high), or ``None`` for too few values.

    Two order statistics that bracket the true median with probability >= ``level`` (the sign
    test's interval, ``scipy.stats.quantile_test``). Five rounds cannot give 95 % (min..max
    covers 93.75 %), six can.

    >>> median_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    (1.0, 6.0)
    """
    if not values:
        return None
    ci = stats.quantile_test(values, q=float(np.median(values)), p=0.5).confidence_interval(level)
    return None if np.isnan(ci.low) or np.isnan(ci.high) else (float(ci.low), float(ci.high))


def ci_cell(values: Sequence[float] | None) -> str:
    """The median's 95 % interval as a table cell."""
    ci = median_ci(values) if values else None
    return f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else "– (too few rounds)"


def verdict(g: dict[str, Any], values: Sequence[float] | None = None) -> str:
    """Whether a goal was met, and whether this run resolves it: by the median's 95 % interval where the
    rounds give one (``values``), else by the per-round range."""
    if g.get("verdict") == "no anchor":
        return "not judged: Lightning's own strategy does not run on this device"
    if "min" not in g:
        return "met" if g["median"] >= g["goal"] else "not met"
    if g["min"] >= g["goal"]:
        return "**met** in every round"
    ci = median_ci(values) if values else None
    if ci and ci[0] >= g["goal"]:
        return "**met**: the median's 95 % interval lies above the goal"
    if ci and ci[1] < g["goal"]:
        return "**not met**: the median's 95 % interval lies below the goal"
    if ci:
        side = "met" if g["median"] >= g["goal"] else "missed"
        return f"{side} by the median; not resolved (the median's 95 % interval contains the goal)"
    if g["median"] >= g["goal"]:
        return "met by the median; not resolved (rounds on both sides of the goal)"
    if g["max"] >= g["goal"]:
        return "missed by the median; not resolved (a round reached the goal)"
    return "**not met** in any round"


def _goal_values(r: dict[str, Any], key: str) -> list[float] | None:
    """The per-round values behind a strategy family's goal ``key`` (for the median's interval)."""
    ra = r.get("ratios", {})
    if key == "plugin/lightning":
        return ra.get("plugin/lightning", {}).get("per_round", {}).get("values")
    p = ra.get("plugin/raw", {}).get("per_round", {}).get("values")
    q = ra.get("lightning/raw", {}).get("per_round", {}).get("values")
    return list(np.divide(p, q)) if p and q else None


def _goal_cell(g: dict[str, Any] | None) -> str:
    if not g:
        return "–"
    if g.get("verdict") == "no anchor":
        return "not judged: no Lightning anchor on this device"
    figure = spread(g) if "min" in g else f"{g['median']:.3f}"
    return f"{figure} (goal ≥ {g['goal']}): {verdict(g)}"


def _ratio_cell(r: dict[str, Any] | None) -> str:
    return spread(r["per_round"]) if r else "–"


def _calls(r: dict[str, Any], name: str) -> tuple[float, float, float] | None:
    """(all calls, the package's own calls, Lightning's calls) per step of a variant, if profiled."""
    c = r.get("calls_per_step", {}).get(name)
    if not c:
        return None
    c = {k: v for k, v in c.items() if not k.startswith("_")}
    return (sum(g["calls"] for g in c.values()), c.get("lightning_anyaccel", {}).get("calls", 0.0),
            c.get("lightning", {}).get("calls", 0.0))


def overhead_verdict(ov: dict[str, Any]) -> str:
    """The one-device goal in words: met or not, the rounds' span, and the call counts."""
    pr = ov["ratios"]["plugin/builtin"]["per_round"]
    span = f"single rounds span {pr['min']:.3f}–{pr['max']:.3f}"
    if ov.get("goal_met"):
        text = f"met ({pr['median']:.3f}; {span})"
    elif pr["max"] >= 1.0:
        text = f"not met in this run ({pr['median']:.3f}), but {span}, so the gap is within this run's noise"
    else:
        text = f"**not met** in this run ({pr['median']:.3f}; {span})"
    c = ov.get("calls_per_step", {})
    if c.get("plugin") and c.get("builtin"):
        same = "the same number of" if c["plugin"] == c["builtin"] else f"{c['plugin'] / c['builtin']:.4f}x the"
        text += f"; the plugin makes {same} function calls per step as the built-in accelerator"
    return text


def where_time_goes(fams: dict[str, Any]) -> list[str]:
    """Per family, what the call counts say: the package's own calls per step, plugin vs Lightning vs raw."""
    parts = []
    for fam, r in fams.items():
        p, lt, raw = _calls(r, "plugin"), _calls(r, "lightning"), _calls(r, "raw")
        if not p:
            continue
        text = f"{FAMILY_LABELS.get(fam, fam)}: plugin {p[0]:,.0f} calls per step, {p[1]:,.0f} of them in the package"
        own = r["calls_per_step"]["plugin"].get("lightning_anyaccel", {}).get("functions", {})
        if own:
            text += " (" + ", ".join(f"`{name}` {n:g}" for name, n in own.items()) + ")"
        if lt:
            text += f"; Lightning's own {lt[0]:,.0f}" + (" (the same)" if round(lt[0]) == round(p[0]) else "")
        if raw:
            text += f"; raw {raw[0]:,.0f}, so the Trainer loop adds {p[0] - raw[0]:,.0f} ({p[2]:,.0f} in Lightning)"
        parts.append(text)
    return parts


def has_median_step(fams: dict[str, Any]) -> bool:
    """Whether any family's plugin / Lightning ratio was also taken from median step times."""
    return any("median_step_per_round" in r.get("ratios", {}).get("plugin/lightning", {}) for r in fams.values())


def knob_effects(kn: dict[str, Any]) -> dict[str, Any]:
    """The DDP options faster / slower than the default in every round, the others, and a refused bf16 hook."""
    ratios = kn.get("ddp", {}).get("ratios", {})
    effect: dict[str, Any] = {"helped": [], "hurt": [], "unclear": []}
    for knob in kn["options"]:
        pr = ratios.get(f"plugin+{knob}/plugin", {}).get("per_round")
        if pr:
            effect["helped" if pr["min"] > 1 else "hurt" if pr["max"] < 1 else "unclear"].append(f"`{knob}`")
    effect["bf16_refused"] = any("bf16" in k for k in kn.get("ddp", {}).get("refused", {}))
    return effect


# ----------------------------------------------------------------------------------------------
# tables: the figures of each table, laid out by tabulate


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table of ``rows`` with its columns lined up, every cell written as given (no number parsing)."""
    return tabulate([[str(c) for c in row] for row in rows], headers=list(headers), tablefmt="github",
                    disable_numparse=True)


def where_and_when(doc: dict[str, Any]) -> str:
    """Date, device, machine, versions, run length and load."""
    meta = doc["meta"]
    m, v, d = meta["machine"], meta["versions"], meta["device"]
    after = ", ".join(f"{n} {(doc[n].get('load_average_after') or ['?'])[0]}" for n in SECTION_NAMES if n in doc)
    return table(("", ""), [
        ("date (UTC)", meta["date"]),
        ("device", f"`{d['type']}`: {d['name']} (count {d['count']}; collective backend `{d.get('backend')}`)"),
        ("CPU", f"{m['cpu_model']}, {m['cpu_cores_logical']} logical / {m['cpu_cores_physical']} physical cores,"
                f" {m['memory_gib']} GiB"),
        ("OS", f"{m['os']} ({m['arch']})"),
        ("versions", f"Python {v['python']}, torch {v['torch']}, lightning {v['lightning']},"
                     f" lightning-anyaccel {v['lightning_anyaccel']}"
                     + "".join(f", {k.replace('_', ' ')} {v[k]}" for k in ("cuda_runtime", "hip_runtime",
                                                                            "xpu_runtime", "driver") if v.get(k))),
        ("code", source_cell(meta.get("source"))),
        ("run", f"mode `{meta['settings']['mode']}`, {meta['runtime_s']:.0f} s in all"),
        *([("sections", sections_cell(doc))] if sections_cell(doc) else []),
        ("machine load", f"load average (1/5/15 min) {meta.get('load_average_before')} before,"
                         f" {meta.get('load_average_after')} after, on {meta['machine'].get('cpu_cores_logical') or 1}"
                         f" cores; after each section: {after}"),
    ])


def source_cell(source: dict[str, Any] | None) -> str:
    """The commit a run measured, and whether the tree had uncommitted changes."""
    if not source or not source.get("commit"):
        return "commit not recorded"
    state = "clean tree" if source.get("clean") else "uncommitted changes in the tree"
    return f"commit `{source['commit'][:12]}` ({state})"


def sections_cell(doc: dict[str, Any]) -> str:
    """Which run each section comes from, when the file merges runs (``python -m benchmarks --merge``); else ''."""
    runs = {n: doc[n]["run"] for n in SECTION_NAMES if n in doc and "run" in doc[n]}
    if len({(r.get("date"), (r.get("source") or {}).get("commit")) for r in runs.values()}) < 2:
        return ""
    return "; ".join(f"{n}: {r['date']}, {source_cell(r.get('source'))}" for n, r in runs.items())


def _noise(doc: dict[str, Any]) -> dict[str, Any]:
    """The highest load average of the run, the cores, and the overhead runs' IQR / median (lowest, highest)."""
    samples = [doc["meta"].get("load_average_before"), doc["meta"].get("load_average_after")]
    samples += [doc[n].get("load_average_after") for n in SECTION_NAMES if n in doc]
    iqr = [s["iqr_rel"] for s in doc.get("overhead", {}).get("steps_per_s", {}).values() if s.get("iqr_rel")]
    return {"load": max((s or [0])[0] for s in samples), "cores": doc["meta"]["machine"].get("cpu_cores_logical") or 1,
            "iqr": (min(iqr), max(iqr)) if iqr else None}


def goals_at_a_glance(doc: dict[str, Any]) -> str:
    """Every goal of the page, its figure from this run and the verdict; empty when the run has none."""
    rows = []
    ov = doc.get("overhead", {})
    if "ratios" in ov and "plugin/builtin" in ov["ratios"]:
        pr = ov["ratios"]["plugin/builtin"]
        c = ov.get("calls_per_step", {})
        values = pr["per_round"].get("values")
        rows.append(["one device: plugin / Lightning's accelerator", f"≥ {ov['goal_plugin_over_builtin']}",
                     spread(pr["per_round"]), ci_cell(values),
                     spread(pr["cpu_per_round"]) if "cpu_per_round" in pr else "–",
                     "same" if c.get("plugin") and c.get("plugin") == c.get("builtin") else "–",
                     verdict({"goal": ov["goal_plugin_over_builtin"], **pr["per_round"]}, values)])
    tr = doc.get("transformer", {})
    if "plugin/builtin" in tr.get("ratios", {}):
        pr = tr["ratios"]["plugin/builtin"]
        values = pr["per_round"].get("values")
        rows.append([f"GPT-2 ({tr['workload']['name']}), tokens/s: plugin / Lightning's accelerator",
                     f"≥ {tr['goal_plugin_over_builtin']}", spread(pr["per_round"]), ci_cell(values),
                     spread(pr["cpu_per_round"]) if "cpu_per_round" in pr else "–", "–",
                     verdict({"goal": tr["goal_plugin_over_builtin"], **pr["per_round"]}, values)])
    for fam, r in doc.get("strategies", {}).get("families", {}).items():
        label = FAMILY_LABELS.get(fam, fam)
        for key, text in (("plugin/lightning", "plugin / Lightning's strategy"),
                          ("plugin/raw vs lightning/raw", "(plugin / raw) ÷ (Lightning / raw)")):
            g = r.get("goals", {}).get(key)
            if not g:
                continue
            if g["verdict"] == "no anchor":
                raw = r["ratios"]["plugin/raw"]
                rows.append([f"{label}: plugin / raw against Lightning", f"≥ {g['goal']}",
                             f"plugin / raw {spread(raw['per_round'])}", ci_cell(raw["per_round"].get("values")),
                             spread(raw["cpu_per_round"]), "–", verdict(g)])
                continue
            values = _goal_values(r, key)
            cpu = r["ratios"].get("plugin/lightning", {}).get("cpu_per_round")
            calls = (_calls(r, "plugin"), _calls(r, "lightning"))
            same = calls[0] and calls[1] and round(calls[0][0]) == round(calls[1][0])
            rows.append([f"{label}: {text}", f"≥ {g['goal']}", spread(g) if "min" in g else f"{g['median']:.3f}",
                         ci_cell(values), spread(cpu) if cpu and key == "plugin/lightning" else "–",
                         "same" if same and key == "plugin/lightning" else "–", verdict(g, values)])
    if not rows:
        return ""
    return table(("figure", "goal", "this run (wall clock)", "median's 95 % interval", "per CPU-second",
                  "calls per step", "verdict"), rows)


def overhead_table(ov: dict[str, Any]) -> str:
    """Steps per second of the one-device variants."""
    cpu = ov.get("cpu_steps_per_s", {})
    return table(
        ("variant", "classes", "steps/s median", "quartiles", "min–max", "IQR / median", "steps per CPU-second, median"),
        ([VARIANT_LABELS.get(name, name), f"`{ov['classes'].get(name, '')}`", f"{s['median']:.1f}",
          f"{s['q1']:.1f}–{s['q3']:.1f}", f"{s['min']:.1f}–{s['max']:.1f}", pct(s["iqr_rel"]),
          f"{cpu[name]['median']:.1f}" if name in cpu else "n/a"] for name, s in ov["steps_per_s"].items()))


def overhead_ratio_table(ov: dict[str, Any]) -> str:
    """The one-device ratios, four ways."""
    return table(
        ("ratio", "median of per-round ratios [min–max]", "ratio of medians", "ratio of best runs",
         "per CPU-second: median of per-round ratios [min–max]"),
        ([name, spread(r["per_round"]), f"{r['of_medians']:.3f}", f"{r['of_best']:.3f}" if "of_best" in r else "n/a",
          spread(r["cpu_per_round"]) if "cpu_per_round" in r else "n/a"] for name, r in ov["ratios"].items()))


def transformer_table(tr: dict[str, Any]) -> str:
    """Tokens per second and model FLOPs utilisation of the transformer variants."""
    mfu = tr.get("mfu") or {}
    return table(
        ("variant", "classes", "tokens/s median", "quartiles", "IQR / median", "model FLOPs utilisation"),
        ([VARIANT_LABELS.get(name, name), f"`{tr['classes'].get(name, '')}`", f"{t['median']:,.0f}",
          f"{t['q1']:,.0f}–{t['q3']:,.0f}", pct(t["iqr_rel"]), pct(mfu[name]) if name in mfu else "n/a (peak unknown)"]
         for name, t in tr["tokens_per_s"].items()))


def transformer_compiled_table(tr: dict[str, Any]) -> str:
    """Eager and ``torch.compile`` tokens/s side by side (plugin and plain loop); '' when not run."""
    c = tr.get("compiled") or {}
    if "tokens_per_s" not in c:
        return ""
    eager, mfu, c_mfu = tr["tokens_per_s"], tr.get("mfu") or {}, c.get("mfu") or {}
    rows = []
    for base, label in (("plugin", "AnyAccelerator (plugin), Trainer"), ("plain", "plain PyTorch loop")):
        comp = c["tokens_per_s"][f"{base}_compiled"]
        rows.append([label, f"{eager[base]['median']:,.0f}", f"{comp['median']:,.0f}",
                     f"{comp['min']:,.0f}–{comp['max']:,.0f}", f"{c['compiled_over_eager'][base]:.2f}",
                     pct(mfu[base]) if base in mfu else "n/a",
                     pct(c_mfu[f"{base}_compiled"]) if f"{base}_compiled" in c_mfu else "n/a"])
    return table(("variant", "eager tokens/s (median)", "compiled tokens/s (median)", "compiled min–max",
                  "compiled / eager", "eager MFU", "compiled MFU"), rows)


def transformer_ratio_table(tr: dict[str, Any]) -> str:
    """The transformer's ratios, with the median's interval and the goal's verdict."""
    rows = []
    for name, r in tr["ratios"].items():
        pr, values = r["per_round"], r["per_round"].get("values")
        goal = {"median": pr["median"], "min": pr["min"], "max": pr["max"], "goal": tr["goal_plugin_over_builtin"]}
        rows.append([name, spread(pr), ci_cell(values), verdict(goal, values) if name == "plugin/builtin" else "–"])
    return table(("ratio", "median of per-round ratios [min–max]", "95 % interval of the median", "verdict"), rows)


def strategies_table(st: dict[str, Any]) -> str:
    """Steps per second per family and variant, with refusals and failures."""
    rows = []
    for fam, r in st.get("families", {}).items():
        label = FAMILY_LABELS.get(fam, fam)
        for name, s in r.get("steps_per_s", {}).items():
            if name.startswith("plugin+"):
                continue
            c = _calls(r, name)
            rows.append([label, STRATEGY_VARIANTS.get(name, name), f"`{r.get('classes', {}).get(name, '')}`",
                         spread(s, "{:.1f}"), f"{r['samples_per_s'][name]:,.0f}",
                         f"{r['cpu_steps_per_s'][name]['median']:.1f}",
                         f"{c[0]:,.0f} ({c[1]:,.0f} / {c[2]:,.0f})" if c else "–"])
        if "skipped" in r:
            rows.append([label, "–", "–", f"skipped: {r['skipped']}", "", "", ""])
        if "lightning" in r.get("refused", {}):
            rows.append([label, "Lightning's own", "–",
                         f"refused by Lightning on this device: {r['refused']['lightning']}", "", "", ""])
        for name, why in r.get("errors", {}).items():
            rows.append([label, name, "–", f"**failed**: `{why.splitlines()[0]}`", "", "", ""])
    return table(("strategy", "variant", "classes", "steps/s median [min–max]", "samples/s (all processes)",
                  "steps per CPU-second", "calls per step (package's own / Lightning's)"), rows)


def strategy_ratio_table(st: dict[str, Any]) -> str:
    """Per family: the ratios, their goals and verdicts, per CPU-second and from median step times."""
    pairs, rows = ("plugin/lightning", "plugin/raw"), []
    for fam, r in st.get("families", {}).items():
        ra, go = r.get("ratios", {}), r.get("goals", {})
        if not ra:
            continue
        cpu = [spread(ra[k]["cpu_per_round"]) if k in ra else "–" for k in pairs]
        typical = [spread(ra[k]["median_step_per_round"]) if "median_step_per_round" in ra.get(k, {}) else "–"
                   for k in pairs]
        rows.append([FAMILY_LABELS.get(fam, fam), _ratio_cell(ra.get("plugin/lightning")),
                     _goal_cell(go.get("plugin/lightning")), _ratio_cell(ra.get("plugin/raw")),
                     _ratio_cell(ra.get("lightning/raw")), _goal_cell(go.get("plugin/raw vs lightning/raw")),
                     *cpu, *typical])
    return table(("strategy", "plugin / Lightning", "goal plugin / Lightning", "plugin / raw", "Lightning / raw",
                  "goal (plugin/raw) ÷ (Lightning/raw)", "per CPU-second: plugin / Lightning",
                  "per CPU-second: plugin / raw", "median step: plugin / Lightning", "median step: plugin / raw"), rows)


def spread_vs_steps_table(fams: dict[str, Any]) -> str:
    """The spread of each per-round ratio over runs cut to their first N steps; empty without such data."""
    spreads = {(fam, pair): rows for fam, r in fams.items() for pair, rows in r.get("spread_vs_steps", {}).items()}
    if not spreads:
        return ""
    windows = sorted({int(n) for rows in spreads.values() for n in rows})
    lines = []
    for (fam, pair), rows in spreads.items():
        full = rows[str(max(int(n) for n in rows))]
        lines.append([f"{FAMILY_LABELS.get(fam, fam)} {pair}",
                      *(f"{100 * rows[str(n)]['range_rel']:.1f} %" if str(n) in rows else "–" for n in windows),
                      f"{100 * (full['median'] - 1):+.1f} %",
                      "yes: every round on the same side of 1" if full["min"] > 1 or full["max"] < 1
                      else "no: rounds on both sides of 1"])
    return table(("ratio", *(f"{n} steps" for n in windows), "gap from 1 at full length", "resolved?"), lines)


def knobs_table(kn: dict[str, Any]) -> str:
    """Steps per second of each DDP option and its ratio to the default, or why it did not run."""
    r = kn.get("ddp", {})
    sps, ratios = r.get("steps_per_s", {}), r.get("ratios", {})
    rows = [["default", spread(sps["plugin"], "{:.2f}"), "1"]] if "plugin" in sps else []
    for knob, options in kn["options"].items():
        name, opt = f"plugin+{knob}", ", ".join(f"{k}={v}" for k, v in options.items())
        if name in sps:
            rows.append([f"`{opt}`", spread(sps[name], "{:.2f}"), _ratio_cell(ratios.get(f"{name}/plugin"))])
        elif name in r.get("refused", {}):
            rows.append([f"`{opt}`", f"refused by torch on this backend: {r['refused'][name]}", "–"])
        elif name in r.get("errors", {}):
            rows.append([f"`{opt}`", f"**failed**: `{r['errors'][name].splitlines()[0]}`", "–"])
    return table(("option", "steps/s median [min–max]", "÷ default, per round median [min–max]"), rows)


def collective_table(co: dict[str, Any]) -> str:
    """all_reduce and memcpy bandwidth per message size."""
    ar, rows = {r["bytes"]: r for r in co.get("all_reduce", [])}, []
    for mc in co["memcpy"]:
        r = ar.get(mc["bytes"])
        rows.append([size(mc["bytes"]), f"{r['busbw_gbps']:.3f} [{r['gbps_spread']['min']:.3f}–"
                     f"{r['gbps_spread']['max']:.3f}]", f"{1e3 * r['median_s']:.3f} ms", f"{mc['gbps']:.2f}",
                     f"{r['gbps'] / mc['gbps']:.3f}"] if r else [size(mc["bytes"]), "–", "–", f"{mc['gbps']:.2f}", "–"])
    return table(("size", "all_reduce busbw GB/s [min–max]", "time per all_reduce", "memcpy GB/s",
                  "all_reduce / memcpy"), rows)


def first_step_table(fs: dict[str, Any]) -> str:
    """Seconds per phase and launcher."""
    phases = (*fs["phases"], "total")
    return table(("launcher", *(PHASE_LABELS.get(p, p) for p in phases)),
                 ([method, *(spread(row[p], "{:.2f}") for p in phases)] for method, row in fs["seconds"].items()))


def device_module_table(dc: dict[str, Any]) -> str:
    """Calls per step into the device module, by function, with their most frequent callers."""
    return table(("device-module function", "calls per step", "most frequent callers"),
                 ([f"`{fn}`", f"{row['calls']:.1f}", ", ".join(f"`{c}` {n:.1f}" for c, n in row["callers"].items())]
                  for fn, row in dc["device_module_calls"].items()))


def differing_functions_table(dc: dict[str, Any]) -> str:
    """The functions whose calls per step differ most between the device and CPU."""
    return table(("function", "calls per step, device − CPU"),
                 ([f"`{fn}`", f"{d:+.1f}"] for fn, d in dc["differing_functions_per_step"].items()))


# ----------------------------------------------------------------------------------------------
# the page


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE.parent), undefined=jinja2.Undefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters.update(spread=spread, pct=pct, size=size, fmt=format, code=lambda name: f"`{name}`")
    env.globals.update(VARIANT_LABELS=VARIANT_LABELS, STRATEGY_VARIANTS=STRATEGY_VARIANTS, **{
        f.__name__: f for f in (where_and_when, goals_at_a_glance, overhead_table, overhead_ratio_table,
                                overhead_verdict, transformer_table, transformer_ratio_table, transformer_compiled_table,
                                strategies_table,
                                strategy_ratio_table, has_median_step, where_time_goes, spread_vs_steps_table,
                                knobs_table, knob_effects, collective_table, first_step_table, device_module_table,
                                differing_functions_table)})
    return env


def _one_line_paragraphs(text: str) -> str:
    """The page with each paragraph on one line: the template wraps its prose, and a wrapped line that began
    with a figure could read as a list item. Fenced blocks, tables, headings and images stay as they are."""
    lines: list[str] = []
    fenced = False
    for line in text.split("\n"):
        fenced ^= line.startswith("```")
        if lines and lines[-1] and line and not fenced and not line.startswith(("```", "|", "#", "![")) \
                and not lines[-1].startswith(("```", "|", "#", "![")):
            lines[-1] += " " + line
        else:
            lines.append(line)
    return "\n".join(lines)


def render(results: Path, page: Path | None = None, images: Path | None = None) -> list[Path]:
    """Write the plots and the docs page for ``results``; return the paths written.

    ``page`` and ``images`` default to the device type's (:func:`page_for`).
    """
    doc = json.loads(Path(results).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{results} is not a {SCHEMA} results file")
    default_page, default_images = page_for(doc["meta"]["device"]["type"])
    page, images = page or default_page, images or default_images
    files = _plots(doc, images)
    prefix = os.path.relpath(images, page.parent).replace(os.sep, "/")
    try:
        source = Path(results).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        source = Path(results).name
    text = _environment().get_template(TEMPLATE.name).render(
        doc=doc, source=source, other_pages=_other_pages(doc["meta"]["device"]["type"]), noise=_noise(doc),
        cuda_page=page_for("cuda")[0].exists() and results_for("cuda").exists(),
        images={name: f"{prefix}/{file}" for name, file in files.items()})
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(_one_line_paragraphs(text))
    return [page, *(images / f for f in files.values())]


if __name__ == "__main__":
    for p in render(Path(sys.argv[1]) if len(sys.argv) > 1 else results_for("cpu")):
        print(p)
