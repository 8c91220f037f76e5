"""Turn one results file into plots and a documentation page: ``docs/benchmarks.md`` for CPU.

    python -m benchmarks.report [benchmarks/results/cpu.json]

One page per device type (:func:`page_for`): ``benchmarks/results/cpu.json`` becomes
``docs/benchmarks.md``, ``benchmarks/results/cuda.json`` becomes ``docs/benchmarks_cuda.md``.
Everything on a page comes from its single file, so every ratio on it was measured on one
machine in one run. Plots go to ``docs/images/benchmarks/`` (``.../<type>/`` for other devices;
skipped, with a note, when matplotlib is not installed: ``pip install -e .[bench]``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, ROOT, SCHEMA

DOCS_PAGE = ROOT / "docs" / "benchmarks.md"
IMAGES_DIR = ROOT / "docs" / "images" / "benchmarks"


def results_for(device_type: str) -> Path:
    """The results file of a device type: ``benchmarks/results/<type>.json``."""
    return RESULTS_DIR / f"{device_type}.json"


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
VARIANT_LABELS = {"plugin": "AnyAccelerator (plugin)", "builtin": "Lightning built-in", "plain": "plain PyTorch loop"}
PHASE_LABELS = {"import": "import", "launch_rendezvous": "launch + rendezvous", "first_step": "first step"}


def _size(nbytes: float) -> str:
    for unit, factor in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            return f"{nbytes / factor:.3g} {unit}"
    return f"{nbytes:g} B"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def _spread(s: dict[str, Any], fmt: str = "{:.3f}") -> str:
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
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: _size(x)))
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
# markdown


def _header(doc: dict[str, Any], source: str) -> list[str]:
    meta = doc["meta"]
    m, v, d = meta["machine"], meta["versions"], meta["device"]
    load_b, load_a = meta.get("load_average_before"), meta.get("load_average_after")
    cores = m.get("cpu_cores_logical") or 1
    others = _other_pages(d["type"])
    return [
        "# Benchmarks" if d["type"] == "cpu" else f"# Benchmarks on `{d['type']}`: {d['name']}",
        "",
        "What the plugin costs compared with Lightning's own accelerator and strategies and with hand-written",
        "PyTorch loops around the same parallel wrappers (DDP, FSDP, FSDP2, DeepSpeed), how fast the collective",
        "backend is, how long each launcher takes to the first step, and whether the device-generic path adds",
        "per-step device calls.",
        "",
        "```{note}",
        f"This page is generated by `benchmarks/report.py` from `{source}` (one run on one machine);",
        "`make bench` measures again and rewrites it. Every ratio below comes from that single run."
        + (" Runs on other devices, each on its own page: " + "; ".join(others) + "." if others else ""),
        "```",
        "",
        *(["**Corrections** made to the results file after the run: " + " ".join(meta["corrections"]), ""]
          if meta.get("corrections") else []),
        "## Where and when",
        "",
        "| | |",
        "|---|---|",
        f"| date (UTC) | {meta['date']} |",
        f"| device | `{d['type']}`: {d['name']} (count {d['count']}; collective backend `{d.get('backend')}`) |",
        f"| CPU | {m['cpu_model']}, {m['cpu_cores_logical']} logical / {m['cpu_cores_physical']} physical cores,"
        f" {m['memory_gib']} GiB |",
        f"| OS | {m['os']} ({m['arch']}) |",
        f"| versions | Python {v['python']}, torch {v['torch']}, lightning {v['lightning']},"
        f" lightning-anyaccel {v['lightning_anyaccel']} |",
        f"| run | mode `{meta['settings']['mode']}`, {meta['runtime_s']:.0f} s in all |",
        f"| machine load | load average (1/5/15 min) {load_b} before, {load_a} after, on {cores} cores;"
        " after each section: " + ", ".join(f"{n} {(doc[n].get('load_average_after') or ['?'])[0]}"
                                            for n in SECTION_NAMES if n in doc)
        + " |",
        "",
        _noise_sentence(doc, cores),
        "",
        *_at_a_glance(doc),
    ]


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median of ``values``: (low, high, coverage), or ``None``.

    The order statistics ``x(j)`` and ``x(n+1-j)`` bracket the true median with probability
    ``1 - 2 P(B <= j-1)``, ``B ~ Binomial(n, 1/2)``; ``j`` is the largest with coverage >= ``level``.
    Five rounds cannot give 95 % (min..max covers 93.75 %), six can.

    >>> median_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    (1.0, 6.0, 0.96875)
    """
    import math

    data, n = sorted(values), len(values)
    best = None
    for j in range(1, n // 2 + 1):
        coverage = 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n
        if coverage < level:
            break
        best = (data[j - 1], data[n - j], coverage)
    return best


def _ci_cell(values: list[float] | None) -> str:
    ci = median_ci(values) if values else None
    return f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else "– (too few rounds)"


def _at_a_glance(doc: dict[str, Any]) -> list[str]:
    """Every goal of the page, its figure from this run, and whether the run met it."""
    rows = []
    ov = doc.get("overhead", {})
    if "ratios" in ov and "plugin/builtin" in ov["ratios"]:
        pr = ov["ratios"]["plugin/builtin"]
        c = ov.get("calls_per_step", {})
        same = "same" if c.get("plugin") and c.get("plugin") == c.get("builtin") else "–"
        values = pr["per_round"].get("values")
        g = {"goal": ov["goal_plugin_over_builtin"], **pr["per_round"]}
        rows.append(f"| one device: plugin / Lightning's accelerator | ≥ {g['goal']} | {_spread(pr['per_round'])} |"
                    f" {_ci_cell(values)} | {_spread(pr['cpu_per_round']) if 'cpu_per_round' in pr else '–'} |"
                    f" {same} | {_verdict(g, values)} |")
    for fam, r in doc.get("strategies", {}).get("families", {}).items():
        label = FAMILY_LABELS.get(fam, fam)
        for key, text in (("plugin/lightning", "plugin / Lightning's strategy"),
                          ("plugin/raw vs lightning/raw", "(plugin / raw) ÷ (Lightning / raw)")):
            g = r.get("goals", {}).get(key)
            if not g:
                continue
            if g["verdict"] == "no anchor":
                raw = r["ratios"]["plugin/raw"]["per_round"]
                rows.append(f"| {label}: plugin / raw against Lightning | ≥ {g['goal']} | plugin / raw {_spread(raw)} |"
                            f" {_ci_cell(raw.get('values'))} | {_spread(r['ratios']['plugin/raw']['cpu_per_round'])} |"
                            f" – | {_verdict(g)} |")
                continue
            values = _goal_values(r, key)
            figure = _spread(g) if "min" in g else f"{g['median']:.3f}"
            cpu = r["ratios"].get("plugin/lightning", {}).get("cpu_per_round")
            cpu_cell = _spread(cpu) if cpu and key == "plugin/lightning" else "–"
            calls = (_calls(r, "plugin"), _calls(r, "lightning"))
            same = "same" if calls[0] and calls[1] and round(calls[0][0]) == round(calls[1][0]) else "–"
            rows.append(f"| {label}: {text} | ≥ {g['goal']} | {figure} | {_ci_cell(values)} | {cpu_cell} |"
                        f" {same if key == 'plugin/lightning' else '–'} | {_verdict(g, values)} |")
    if not rows:
        return []
    return [
        "## Goals at a glance",
        "",
        "Medians of per-round ratios of steps per second [min–max over rounds], from this run only, with a 95 %"
        " interval for that median (distribution-free, from the order statistics of the rounds; six rounds or more),"
        " next to the same ratio of steps per CPU-second of the process (less disturbed by other jobs) and whether"
        " the plugin and Lightning make the same number of function calls per step (deterministic). Goals are"
        " reported, never asserted in tests. *Not resolved*: the median's interval contains the goal (or, with too"
        " few rounds for one, the rounds fall on both sides of it), so this run cannot tell whether it is met.",
        "",
        "| figure | goal | this run (wall clock) | median's 95 % interval | per CPU-second | calls per step | verdict |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        _gpu_sentence(doc["meta"]["device"]["type"]),
        "",
    ]


def _gpu_sentence(device_type: str) -> str:
    """On the CPU page: where the GPU figures are, or that they are owed."""
    if device_type != "cpu":
        return ""
    if page_for("cuda")[0].exists() and results_for("cuda").exists():
        return ("GPU figures: [Benchmarks on `cuda`](benchmarks_cuda.md), the same tables measured on an NVIDIA GPU"
                " with Lightning's `CUDAAccelerator` and its own FSDP and DeepSpeed strategies as anchors (figures"
                " from different machines are never combined in one ratio).")
    return ("GPU figures are owed: this run had no GPU. On a machine with an NVIDIA GPU, `make bench` measures the"
            " same tables on `cuda` with Lightning's `CUDAAccelerator` and its own FSDP and DeepSpeed strategies as"
            " anchors, on a page of their own (figures from different machines are never combined in one ratio).")


def _noise_sentence(doc: dict[str, Any], cores: int) -> str:
    """How quiet the machine was, in words, from the load average and the overhead spread."""
    samples = [doc["meta"].get("load_average_before"), doc["meta"].get("load_average_after")]
    samples += [doc[n].get("load_average_after") for n in SECTION_NAMES if n in doc]
    load = max((s or [0])[0] for s in samples)
    spreads = [s["iqr_rel"] for s in doc.get("overhead", {}).get("steps_per_s", {}).values() if s.get("iqr_rel")]
    parts = [f"load average up to {load:.1f} on {cores} cores"]
    if spreads:
        parts.append(f"interquartile range of the overhead runs' steps/s {_pct(min(spreads))}–{_pct(max(spreads))}"
                     " of the median")
    if load > cores + 2:  # the benchmark itself keeps up to 2 processes (and their threads) busy
        return (f"**Noise:** the machine was shared with other jobs ({'; '.join(parts)}), so single measurements"
                " vary a lot. Read medians, spreads and the per-round ratios, which pair runs taken back to back.")
    text = (f"**Noise:** the machine was quiet apart from the benchmark's own processes ({'; '.join(parts)}).")
    if spreads and min(spreads) > 0.05:
        text += (" Yet runs of the same variant still differ by more than 5 %, and their steps per CPU-second move"
                 " with their wall-clock steps/s: the host's CPU itself ran at varying speed (a virtual machine's"
                 " vCPU; the steps are Python-bound), so single rounds scatter and only medians over many rounds"
                 " and the deterministic call counts compare the variants.")
    return text


def _overhead(ov: dict[str, Any], image: str | None) -> list[str]:
    lines = ["## 1. Plugin overhead (one device)", ""]
    if "error" in ov:
        return lines + [f"Failed: `{ov['error']}`", ""]
    w, st = ov["workload"], ov["settings"]
    lines += [
        f"The same `LightningModule` (MLP {w['features']}→{w['width']}×{w['layers']}→{w['classes']},"
        f" {w['params']:,} parameters, batch {w['batch']}) and data, trained three ways, {st['reps']} rounds"
        f" interleaved ({ov['order']}); each run skips {st['warmup_steps']} warm-up steps and times"
        f" {st['measured_steps']} steps; intra-op threads: {st['threads']}.",
        "",
        "| variant | classes | steps/s median | quartiles | min–max | IQR / median | steps per CPU-second, median |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in ov["steps_per_s"].items():
        cpu = ov.get("cpu_steps_per_s", {}).get(name)
        lines.append(
            f"| {VARIANT_LABELS.get(name, name)} | `{ov['classes'].get(name, '')}` | {s['median']:.1f} |"
            f" {s['q1']:.1f}–{s['q3']:.1f} | {s['min']:.1f}–{s['max']:.1f} | {_pct(s['iqr_rel'])} |"
            f" {cpu['median']:.1f} |" if cpu else " n/a |"
        )
    calls = ov.get("calls_per_step")
    if calls:
        lines += ["", "Function calls per training step (Python and C calls as `cProfile` counts them, over the"
                  " measured steps of one extra, untimed run; deterministic, so machine load cannot blur it): "
                  + ", ".join(f"{VARIANT_LABELS.get(n, n)} {c:,.1f}" for n, c in calls.items()) + "."]
    lines += ["", "| ratio | median of per-round ratios [min–max] | ratio of medians | ratio of best runs"
              " | per CPU-second: median of per-round ratios [min–max] |", "|---|---|---|---|---|"]
    for name, r in ov["ratios"].items():
        best = f"{r['of_best']:.3f}" if "of_best" in r else "n/a"
        cpu = _spread(r["cpu_per_round"]) if "cpu_per_round" in r else "n/a"
        lines.append(f"| {name} | {_spread(r['per_round'])} | {r['of_medians']:.3f} | {best} | {cpu} |")
    lines.append("")
    if "builtin_skipped" in ov:
        lines.append(f"No built-in comparison: {ov['builtin_skipped']}.")
    else:
        pr = ov["ratios"]["plugin/builtin"]["per_round"]
        goal = ov["goal_plugin_over_builtin"]
        spread = f"single rounds span {pr['min']:.3f}–{pr['max']:.3f}"
        if ov.get("goal_met"):
            verdict = f"met ({pr['median']:.3f}; {spread})"
        elif pr["max"] >= 1.0:
            verdict = f"not met in this run ({pr['median']:.3f}), but {spread}, so the gap is within this run's noise"
        else:
            verdict = f"**not met** in this run ({pr['median']:.3f}; {spread})"
        c = ov.get("calls_per_step", {})
        if c.get("plugin") and c.get("builtin"):
            same = "the same number of" if c["plugin"] == c["builtin"] else f"{c['plugin'] / c['builtin']:.4f}x the"
            verdict += f"; the plugin makes {same} function calls per step as the built-in accelerator"
        lines.append(
            f"Goal plugin / built-in ≥ {goal} (median of per-round wall-clock ratios; reported, never asserted):"
            f" {verdict}. The two Lightning variants run the same training loop and differ only in the accelerator"
            " and strategy classes, so a gap beyond the run-to-run spread would be plugin cost. A round is one run"
            " of each variant back to back, so its ratio is the least disturbed by changing load; the best runs"
            " are those least slowed down by other processes; steps per CPU-second count only the CPU time the"
            " benchmark process itself used, which other jobs on a shared machine barely change. plugin / plain"
            " is mostly Lightning's own loop cost (hooks, closures, logging machinery) on a model this small."
        )
    if image:
        lines += ["", f"![Steps per second of the three variants]({image})"]
    return lines + [""]


def _transformer(tr: dict[str, Any], image: str | None) -> list[str]:
    lines = ["## 1b. A transformer: GPT-2 training throughput (one device)", ""]
    if "error" in tr or "skipped" in tr:
        return lines + [f"Not run: `{tr.get('error') or tr.get('skipped')}`", ""]
    w, st = tr["workload"], tr["settings"]
    lines += [
        f"Hugging Face `GPT2LMHeadModel` built from its config ({w['name']}: {w['layers']} blocks of width"
        f" {w['width']}, {w['params']:,} parameters), {w['batch']} sequences of {w['seq']} tokens per step,"
        f" AdamW, {w['precision']}; trained three ways, {st['reps']} rounds interleaved ({tr['order']}); each run"
        f" skips {st['warmup_steps']} warm-up steps and times {st['measured_steps']} steps.",
        "",
        "| variant | classes | tokens/s median | quartiles | IQR / median | model FLOPs utilisation |",
        "|---|---|---|---|---|---|",
    ]
    mfu = tr.get("mfu") or {}
    for name, t in tr["tokens_per_s"].items():
        util = _pct(mfu[name]) if name in mfu else "n/a (peak unknown)"
        lines.append(f"| {VARIANT_LABELS.get(name, name)} | `{tr['classes'].get(name, '')}` | {t['median']:,.0f} |"
                     f" {t['q1']:,.0f}–{t['q3']:,.0f} | {_pct(t['iqr_rel'])} | {util} |")
    peak = tr.get("peak_bf16_tflops")
    lines += ["", f"Utilisation: {w['flops_per_token'] / 1e6:,.1f} MFLOP per token (6 x parameters + attention)"
              f" x tokens/s over the peak dense bf16 throughput of {tr.get('device_name') or 'this device'}"
              + (f" ({peak:,.0f} TFLOP/s, data sheet)." if peak else " (not known to the benchmark: no MFU)."), ""]
    lines += ["| ratio | median of per-round ratios [min–max] | 95 % interval of the median | verdict |",
              "|---|---|---|---|"]
    for name, r in tr["ratios"].items():
        values = r["per_round"].get("values")
        goal = {"median": r["per_round"]["median"], "min": r["per_round"]["min"],
                "max": r["per_round"]["max"], "goal": tr["goal_plugin_over_builtin"]}
        verdict = _verdict(goal, values) if name == "plugin/builtin" else "–"
        lines.append(f"| {name} | {_spread(r['per_round'])} | {_ci_cell(values)} | {verdict} |")
    if "builtin_skipped" in tr:
        lines += ["", f"No built-in comparison: {tr['builtin_skipped']}."]
    lines += ["", f"Goal plugin / built-in ≥ {tr['goal_plugin_over_builtin']} (median of per-round ratios; reported,"
              " never asserted). On an accelerator the step is bound by the device, so run-to-run noise is small"
              " and the verdict can be resolved; on CPU the model is kept small to bound the run time."]
    return lines + [""]


def _ratio_cell(r: dict[str, Any] | None) -> str:
    return _spread(r["per_round"]) if r else "–"


def _goal_values(r: dict[str, Any], key: str) -> list[float] | None:
    """The per-round values behind a strategy family's goal ``key`` (for the median's interval)."""
    ra = r.get("ratios", {})
    if key == "plugin/lightning":
        return ra.get("plugin/lightning", {}).get("per_round", {}).get("values")
    p = ra.get("plugin/raw", {}).get("per_round", {}).get("values")
    q = ra.get("lightning/raw", {}).get("per_round", {}).get("values")
    return [a / b for a, b in zip(p, q)] if p and q else None


def _verdict(g: dict[str, Any], values: list[float] | None = None) -> str:
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


def _goal_cell(g: dict[str, Any] | None) -> str:
    if not g:
        return "–"
    if g.get("verdict") == "no anchor":
        return "not judged: no Lightning anchor on this device"
    figure = _spread(g) if "min" in g else f"{g['median']:.3f}"
    return f"{figure} (goal ≥ {g['goal']}): {_verdict(g)}"


def _calls(r: dict[str, Any], name: str) -> tuple[float, float, float] | None:
    """(all calls, the package's own calls, Lightning's calls) per step of a variant, if profiled."""
    c = r.get("calls_per_step", {}).get(name)
    if not c:
        return None
    c = {k: v for k, v in c.items() if not k.startswith("_")}
    return (sum(g["calls"] for g in c.values()), c.get("lightning_anyaccel", {}).get("calls", 0.0),
            c.get("lightning", {}).get("calls", 0.0))


def _strategies(st: dict[str, Any], image: str | None) -> list[str]:
    lines = ["## 2. Strategies side by side: plugin, Lightning's own, plain PyTorch", ""]
    if "error" in st:
        return lines + [f"Failed: `{st['error']}`", ""]
    if "skipped" in st:
        return lines + [f"Skipped: {st['skipped']}.", ""]
    w, cfg = st["workload"], st["settings"]
    one = cfg["processes"] == 1
    if one:
        lines += [f"**One device.** {st['one_device'][0].upper()}{st['one_device'][1:]}. No collective crosses a"
                  " link, so there is no scaling figure; a machine with 2 or more devices runs 2 processes.", ""]
    lines += [
        f"{cfg['processes']} process{'' if one else 'es'} ({cfg['threads_per_process']} thread each, backend"
        f" `{st.get('backend')}`, device `{st.get('device')}` on rank 0) train the MLP {w['features']}→{w['width']}×{w['layers']}→"
        f"{w['classes']} ({w['params']:,} parameters, batch {w['batch']} per process, SGD) on the same data three"
        " ways per strategy: the package's strategy with `AnyAccelerator` (**plugin**), Lightning's own strategy with"
        " Lightning's accelerator where Lightning runs on this device (**Lightning**), and a hand-written loop around"
        " the same torch/DeepSpeed wrapper (**raw**: forward, loss, backward, `optimizer.step()`,"
        " `zero_grad(set_to_none=True)`)."
        + (" The process is" if one else " Both processes are")
        + " started once and every variant runs in"
        + (" it" if one else " them")
        + f" (the Trainers find the process group as under `torchrun`), in {cfg['rounds']} interleaved rounds"
        f" (plugin, Lightning, raw, plugin, ...); each run trains {cfg['warmup_steps']} warm-up steps and"
        f" times {cfg['measured_steps']}. A round's ratio compares runs taken back to back. Before the timed"
        f" rounds, one untimed round counts function calls per step under `cProfile` ({cfg['profiled_steps']}"
        " steps on rank 0).",
        "",
        "| strategy | variant | classes | steps/s median [min–max] | samples/s (all processes) | steps per CPU-second"
        " | calls per step (package's own / Lightning's) |",
        "|---|---|---|---|---|---|---|",
    ]
    fams = st.get("families", {})
    for fam, r in fams.items():
        label = FAMILY_LABELS.get(fam, fam)
        for name, s_ in r.get("steps_per_s", {}).items():
            if name.startswith("plugin+"):
                continue
            c = _calls(r, name)
            calls = f"{c[0]:,.0f} ({c[1]:,.0f} / {c[2]:,.0f})" if c else "–"
            cpu = r["cpu_steps_per_s"][name]["median"]
            lines.append(f"| {label} | {STRATEGY_VARIANTS.get(name, name)} | `{r.get('classes', {}).get(name, '')}` |"
                         f" {_spread(s_, '{:.1f}')} | {r['samples_per_s'][name]:,.0f} | {cpu:.1f} | {calls} |")
        if "skipped" in r:
            lines.append(f"| {label} | – | – | skipped: {r['skipped']} | | | |")
        for name, why in r.get("refused", {}).items():
            if name == "lightning":
                lines.append(f"| {label} | Lightning's own | – | refused by Lightning on this device: {why} | | | |")
        for name, why in r.get("errors", {}).items():
            lines.append(f"| {label} | {name} | – | **failed**: `{why.splitlines()[0]}` | | | |")
    lines += [
        "",
        "Ratios of steps/s, per round: median [min–max]. Goals (reported, never asserted): plugin / Lightning ≥"
        f" {st['goals']['plugin/lightning']}; plugin / raw at least {st['goals']['plugin/raw vs lightning/raw']} of"
        " what Lightning's own strategy reaches against raw, i.e. (plugin/raw) ÷ (Lightning/raw) ≥"
        f" {st['goals']['plugin/raw vs lightning/raw']}, per round. *Not resolved*: rounds fall on both sides of"
        " the goal.",
        "",
        "| strategy | plugin / Lightning | goal plugin / Lightning | plugin / raw | Lightning / raw"
        " | goal (plugin/raw) ÷ (Lightning/raw) | per CPU-second: plugin / Lightning | per CPU-second: plugin / raw"
        " | median step: plugin / Lightning | median step: plugin / raw |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fam, r in fams.items():
        ra, go = r.get("ratios", {}), r.get("goals", {})
        if not ra:
            continue
        pairs = ("plugin/lightning", "plugin/raw")
        cpu = {k: _spread(ra[k]["cpu_per_round"]) if k in ra else "–" for k in pairs}
        typical = {k: _spread(ra[k]["median_step_per_round"]) if "median_step_per_round" in ra.get(k, {}) else "–"
                   for k in pairs}
        lines.append(f"| {FAMILY_LABELS.get(fam, fam)} | {_ratio_cell(ra.get('plugin/lightning'))} |"
                     f" {_goal_cell(go.get('plugin/lightning'))} | {_ratio_cell(ra.get('plugin/raw'))} |"
                     f" {_ratio_cell(ra.get('lightning/raw'))} | {_goal_cell(go.get('plugin/raw vs lightning/raw'))} |"
                     f" {cpu['plugin/lightning']} | {cpu['plugin/raw']} | {typical['plugin/lightning']} |"
                     f" {typical['plugin/raw']} |")
    if any("median_step_per_round" in r.get("ratios", {}).get("plugin/lightning", {}) for r in fams.values()):
        lines += ["", "*Median step*: the same per-round ratio from each run's median step time instead of its mean"
                  " (steps/s): it ignores the slow steps a busy or throttled host scatters over a run, which hit the"
                  " variants unevenly."]
    ddp = fams.get("ddp", {})
    if ddp.get("efficiency"):
        eff = ddp["efficiency"]
        lines += ["", "DDP weak-scaling efficiency (steps/s with 2 processes ÷ steps/s of one process training the"
                  " unwrapped model alone, per round; 1.0 is perfect, the batch per process is the same): "
                  + ", ".join(f"{STRATEGY_VARIANTS[n]} {_spread(e, '{:.2f}')}" for n, e in eff.items()) + "."]
    lines += ["", _where_time_goes(fams)]
    spread_rows = {(fam, pair): rows for fam, r in fams.items() for pair, rows in r.get("spread_vs_steps", {}).items()}
    if spread_rows:
        windows = sorted({int(n) for rows in spread_rows.values() for n in rows})
        lines += [
            "",
            f"**How long, and why.** Each variant runs {cfg['rounds']} rounds of {cfg['measured_steps']} timed steps"
            f" (`benchmarks/run.py`, `Settings`); this section took {st.get('runtime_s', 0) / 60:.0f} min of the"
            " run (the whole run: see *Where and when*; the defaults keep `make bench` near 10 minutes on an idle"
            " 2-core machine, 20 when it is shared, and a faster machine affords more rounds with `--set`, see"
            " *Reproduce*). The table cuts the same runs to their first N timed steps and gives the spread of the"
            " per-round ratio ((max − min) ÷ median over the rounds) for each N: it shrinks with N while the"
            " step-to-step jitter averages out, and stops shrinking once load changes between runs dominate (on a"
            " shared machine, early). A gap is resolved when every round lies on the same side of 1; where it is"
            " not, the call counts above (deterministic) and the ratios per CPU-second (barely touched by other"
            " processes) are the better evidence.",
            "",
            "| ratio | " + " | ".join(f"{n} steps" for n in windows) + " | gap from 1 at full length | resolved? |",
            "|---|" + "---|" * (len(windows) + 2),
        ]
        for (fam, pair), rows in spread_rows.items():
            cells = [f"{100 * rows[str(n)]['range_rel']:.1f} %" if str(n) in rows else "–" for n in windows]
            full = rows[str(max(int(n) for n in rows))]
            gap = f"{100 * (full['median'] - 1):+.1f} %"
            resolved = ("yes: every round on the same side of 1" if full["min"] > 1 or full["max"] < 1
                        else "no: rounds on both sides of 1")
            lines.append(f"| {FAMILY_LABELS.get(fam, fam)} {pair} | " + " | ".join(cells) + f" | {gap} | {resolved} |")
    if image:
        lines += ["", f"![Steps per second per strategy and variant]({image})"]
    lines.append("")
    if "knobs" in st:
        lines += _knobs(st["knobs"])
    return lines


def _where_time_goes(fams: dict[str, Any]) -> str:
    """What the call counts say: the package's own calls per step, and plugin vs Lightning vs raw."""
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
    if not parts:
        return ""
    text = ("**Where the time goes** (function calls per training step, `cProfile`, rank 0; deterministic): "
            + "; ".join(parts) + ". Calls in the package per step are what the plugin itself adds to a step"
            " (where there are any, they are the package's overrides of hooks Lightning calls every step anyway,"
            " e.g. the FSDP precision plugin's `forward_context`, which Lightning's `FSDPPrecision` binds to `cuda`);"
            " the rest of the gap to raw is Lightning's training loop (hooks, closures, result collection),"
            " which Lightning's own strategy pays as well.")
    ra = fams.get("ddp", {}).get("ratios", {})
    if "raw+sigterm_broadcast/raw" in ra and "plugin/raw+sigterm_broadcast" in ra:
        text += (
            " One piece of that loop is a collective: with more than one process, Lightning 2.6 broadcasts a"
            " one-element tensor from rank 0 and reads it on the host before **every** training step"
            " (`_TrainingEpochLoop._broadcast_sigterm_tensor`, SIGTERM propagation; on an accelerator this is also a"
            " device synchronisation per step; upstream: Lightning-AI/pytorch-lightning#21487, PR #21640 makes it"
            " configurable). The plain DDP loop with the same broadcast added reaches"
            f" {_spread(ra['raw+sigterm_broadcast/raw']['per_round'])} of the plain loop, and the plugin reaches"
            f" {_spread(ra['plugin/raw+sigterm_broadcast']['per_round'])} of that loop: the part of plugin / raw"
            " the broadcast does not explain is the Trainer's Python per step.")
    return text


def _knobs(kn: dict[str, Any]) -> list[str]:
    lines = ["### DDP options through `AnyDDPStrategy`", ""]
    if "error" in kn:
        return lines + [f"Failed: `{kn['error']}`", ""]
    w, cfg, r = kn["workload"], kn["settings"], kn.get("ddp", {})
    lines += [
        "`AnyDDPStrategy` passes every keyword argument it does not know to `DistributedDataParallel`, like"
        " Lightning's `DDPStrategy` (`tests/test_ddp_knobs.py` checks that they reach the DDP module), and"
        " registers `ddp_comm_hook` on every device type (Lightning's `DDPStrategy` only on CUDA):",
        "",
        "```python",
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks",
        "from lightning_anyaccel import AnyDDPStrategy",
        "",
        "strategy = AnyDDPStrategy(gradient_as_bucket_view=True, static_graph=True, bucket_cap_mb=100,",
        "                          ddp_comm_hook=default_hooks.fp16_compress_hook)",
        "```",
        "",
        f"Measured in the same {'process' if cfg.get('processes', 2) == 1 else 'pair of processes'} after the"
        " strategies, on the communication-bound MLP"
        f" ({w['params']:,} parameters, {_size(w['grad_bytes'])} of gradients per step, batch {w['batch']}),"
        f" {cfg['rounds']} interleaved rounds of {cfg['measured_steps']} timed steps; ratio = steps/s with the"
        " option ÷ steps/s of the default `AnyDDPStrategy()` in the same round.",
        "",
        "| option | steps/s median [min–max] | ÷ default, per round median [min–max] |",
        "|---|---|---|",
    ]
    sps, ratios = r.get("steps_per_s", {}), r.get("ratios", {})
    if "plugin" in sps:
        lines.append(f"| default | {_spread(sps['plugin'], '{:.2f}')} | 1 |")
    for knob, options in kn["options"].items():
        name = f"plugin+{knob}"
        opt = ", ".join(f"{k}={v}" for k, v in options.items())
        if name in sps:
            lines.append(f"| `{opt}` | {_spread(sps[name], '{:.2f}')} | {_ratio_cell(ratios.get(f'{name}/plugin'))} |")
        elif name in r.get("refused", {}):
            lines.append(f"| `{opt}` | refused by torch on this backend: {r['refused'][name]} | – |")
        elif name in r.get("errors", {}):
            lines.append(f"| `{opt}` | **failed**: `{r['errors'][name].splitlines()[0]}` | – |")
    helped, hurt, unclear = [], [], []
    for knob in kn["options"]:
        pr = ratios.get(f"plugin+{knob}/plugin", {}).get("per_round")
        if pr:
            (helped if pr["min"] > 1 else hurt if pr["max"] < 1 else unclear).append(f"`{knob}`")
    lines += ["", "In this run, faster than the default in every round: " + (", ".join(helped) or "none")
              + "; slower in every round: " + (", ".join(hurt) or "none") + "; within the run-to-run spread: "
              + (", ".join(unclear) or "none") + ". What an option gains depends on the model, the backend and the"
              " network: measure your own job before keeping one."]
    if cfg.get("processes") == 1:
        lines += ["", "With one process no gradient crosses a link: these options can only cost here, and what they"
                  " gain needs 2 or more devices."]
    if any("bf16" in k for k in r.get("refused", {})):
        lines += ["", "torch implements `bf16_compress_hook` for NCCL and XCCL only; on gloo (CPU) use"
                  " `fp16_compress_hook`, which gloo all-reduces."]
    return lines + [""]


def _collective(co: dict[str, Any], image: str | None) -> list[str]:
    lines = ["## 3. all_reduce bandwidth and memcpy", ""]
    if "error" in co:
        return lines + [f"Failed: `{co['error']}`", ""]
    st = co["settings"]
    lines += [
        f"{st['world_size']} processes on {st['address']}, backend `{co.get('backend')}`, {st['dtype']} tensors,"
        f" threads per process: {st['threads_per_process']}; median of {st['trials']} trials per size."
        " algbw = bytes / time per all_reduce; busbw = algbw × 2(n−1)/n (nccl-tests convention; equal to"
        " algbw for 2 processes). memcpy = `dst.copy_(src)` on one device, bytes / time.",
        "",
    ]
    if "skipped" in co:
        lines += [f"all_reduce skipped: {co['skipped']}.", ""]
    ar = {r["bytes"]: r for r in co.get("all_reduce", [])}
    lines += ["| size | all_reduce busbw GB/s [min–max] | time per all_reduce | memcpy GB/s | all_reduce / memcpy |",
              "|---|---|---|---|---|"]
    for mc in co["memcpy"]:
        r = ar.get(mc["bytes"])
        if r:
            lines.append(f"| {_size(mc['bytes'])} | {r['busbw_gbps']:.3f} [{r['gbps_spread']['min']:.3f}–"
                         f"{r['gbps_spread']['max']:.3f}] | {1e3 * r['median_s']:.3f} ms | {mc['gbps']:.2f} |"
                         f" {r['gbps'] / mc['gbps']:.3f} |")
        else:
            lines.append(f"| {_size(mc['bytes'])} | – | – | {mc['gbps']:.2f} | – |")
    if image:
        lines += ["", f"![all_reduce and memcpy bandwidth]({image})"]
    return lines + [""]


def _first_step(fs: dict[str, Any], image: str | None) -> list[str]:
    lines = ["## 4. Time to first step: popen, spawn, fork", ""]
    if "error" in fs:
        return lines + [f"Failed: `{fs['error']}`", ""]
    st = fs["settings"]
    lines += [
        f"A fresh interpreter runs a {st['processes']}-process `{st['strategy']}` fit of one step; times are"
        f" seconds, median [min–max] of {st['reps']} run(s), launchers interleaved. *import*: interpreter start"
        " and importing torch, Lightning and the package; *launch + rendezvous*: starting the other processes"
        " (popen: a new interpreter per rank that imports everything again; spawn: the same for every rank;"
        " fork: a copy of the parent) and joining the process group; *first step*: DDP wrapping and the"
        " first optimizer step on rank 0.",
        "",
        "| launcher | " + " | ".join(PHASE_LABELS.get(p, p) for p in fs["phases"]) + " | total |",
        "|---|" + "---|" * (len(fs["phases"]) + 1),
    ]
    for method, phases in fs["seconds"].items():
        cells = [_spread(phases[p], "{:.2f}") for p in (*fs["phases"], "total")]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if image:
        lines += ["", f"![Time to first step per launcher]({image})"]
    return lines + [""]


def _device_calls(dc: dict[str, Any], image: str | None) -> list[str]:
    lines = ["## 5. Per-step calls on the device against CPU", ""]
    if "error" in dc:
        return lines + [f"Failed: `{dc['error']}`", ""]
    if "skipped" in dc:
        return lines + [f"Not run: {dc['skipped']}. `python -m benchmarks --device emulated:NAME` runs every"
                        " section on the tests' emulated device and adds this one.", ""]
    dev, cfg = dc["device"], dc["settings"]
    calls = dc["calls_per_step"]
    if "emulated" in dc:
        em = dc["emulated"]["device"]
        lines += [f"Measured on the tests' emulated device, loaded as `{dev}` ({em['name']}, {em['count']} devices,"
                  f" backend `{em.get('backend')}`) in a child process of this run on the same machine: it checks that"
                  " the device-generic path adds no per-step device calls, nothing about speed.", ""]
    in_package = dc.get("differing_in_package", [])
    lines += [
        f"`AnyAccelerator('{dev}')` and `AnyAccelerator('cpu')` with `any_single`, the overhead MLP, function calls"
        f" per step over {cfg['profiled_steps']} steps under `cProfile` (a check of what runs per step, not a speed"
        f" claim): {dev} {calls[dev]:,.1f}, cpu {calls['cpu']:,.1f}; calls into the device module"
        f" `torch.{dev}` ({dc['device_module_functions']} Python functions): {dc['device_module_calls_per_step']:.1f}"
        " per step; functions of the package whose per-step count differs between the devices:"
        f" {', '.join(f'`{n}`' for n in in_package) if in_package else 'none'}.",
        "",
    ]
    if dc.get("device_module_calls"):
        lines += ["| device-module function | calls per step | most frequent callers |", "|---|---|---|"]
        for fn, row in dc["device_module_calls"].items():
            callers = ", ".join(f"`{c}` {n:.1f}" for c, n in row["callers"].items())
            lines.append(f"| `{fn}` | {row['calls']:.1f} | {callers} |")
        lines.append("")
    if dc.get("differing_functions_per_step"):
        lines += [f"Functions whose calls per step differ ({dev} − cpu; {dc['differing_functions_total']} in all,"
                  " the largest differences):", "", "| function | calls per step, device − CPU |", "|---|---|"]
        for fn, d in dc["differing_functions_per_step"].items():
            lines.append(f"| `{fn}` | {d:+.1f} |")
        lines.append("")
    return lines


def _footer(doc: dict[str, Any]) -> list[str]:
    meta = doc["meta"]
    took = f"{meta['runtime_s'] / 60:.0f} min in mode `{meta['settings']['mode']}` for this run"
    overrides = meta.get("overrides") or []
    this_run = (["", "This run: `python -m benchmarks " + " ".join(f"--set {o}" for o in overrides)
                 + "` (the settings this run changed from the defaults)."] if overrides else [])
    return [
        "## Reproduce",
        "",
        "```bash",
        f"make bench                      # every section, then this page ({took})",
        "make bench BENCH_ARGS=--quick   # smaller sizes, fewer rounds (a few minutes)",
        "python -m benchmarks --only overhead,strategies --out /tmp/mine.json --no-report",
        "python -m benchmarks --device emulated:npu   # everything on the tests' emulated device (tests/emulator)",
        "```",
        "",
        "The device is the one `torch.accelerator` reports (CPU without one); the built-in comparison uses the"
        " accelerator named by the device table's `lightning_builtin` field, so the same code runs on a GPU"
        " machine. Results files (`benchmarks/results/*.json`) record the machine, versions, date and load;"
        " results from different machines are never combined in one ratio.",
        *this_run,
        "",
    ]


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
    made = {name: f"{prefix}/{file}" for name, file in files.items()}
    try:
        source = Path(results).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        source = Path(results).name
    lines = _header(doc, source)
    sections = (("overhead", _overhead), ("transformer", _transformer), ("strategies", _strategies),
                ("collective", _collective),
                ("first_step", _first_step), ("device_calls", _device_calls))
    for name, fn in sections:
        if name in doc:
            lines += fn(doc[name], made.get(name))
    if not made:
        lines += ["(Plots were not drawn: matplotlib is not installed; `pip install -e .[bench]`.)", ""]
    lines += _footer(doc)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(lines))
    return [page, *(images / f for f in files.values())]


if __name__ == "__main__":
    for p in render(Path(sys.argv[1]) if len(sys.argv) > 1 else results_for("cpu")):
        print(p)
