"""Turn one results file into plots and the documentation page ``docs/benchmarks.md``.

    python -m benchmarks.report [benchmarks/results/latest.json]

Everything on the page comes from that single file, so every ratio on it was measured on one
machine in one run. Plots go to ``docs/images/benchmarks/`` (skipped, with a note, when
matplotlib is not installed: ``pip install -e .[bench]``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, ROOT, SCHEMA

DOCS_PAGE = ROOT / "docs" / "benchmarks.md"
IMAGES_DIR = ROOT / "docs" / "images" / "benchmarks"
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
        ax.set_title(f"Plugin overhead, one device — {tag}", fontsize=9)
        made["overhead"] = _save(fig, out_dir / "overhead.png")

    ddp = doc.get("ddp_scaling", {})
    if ddp.get("workloads"):
        fig, ax = plt.subplots(figsize=(6.4, 3.2))
        names = list(ddp["workloads"])
        eff = [ddp["workloads"][n]["efficiency"]["per_round"] for n in names]
        med = [e["median"] for e in eff]
        err = [[m - e["min"] for m, e in zip(med, eff)], [e["max"] - m for m, e in zip(med, eff)]]
        ax.barh(names, med, xerr=err, color=["C0", "C1"][: len(names)], capsize=4)
        for y, m in enumerate(med):
            ax.text(0.02, y, f"{m:.2f}", va="center", color="white", fontweight="bold")
        ax.axvline(1.0, color="gray", ls="--", lw=1)
        ax.set_xlim(0, 1.15)
        ax.set_xlabel("weak-scaling efficiency, 2 processes vs 1 (1.0 = perfect)")
        ax.set_title(f"DDP scaling — {tag}", fontsize=9)
        made["ddp_scaling"] = _save(fig, out_dir / "ddp_scaling.png")

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
        ax.set_title(f"Collective bandwidth — {tag}", fontsize=9)
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
        ax.set_title(f"Time to first step, DDP — {tag}", fontsize=9)
        made["first_step"] = _save(fig, out_dir / "first_step.png")
    return made


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
    return [
        "# Benchmarks",
        "",
        "What the plugin costs compared with Lightning's own accelerator and a hand-written loop, how DDP",
        "scales, how fast the collective backend is, and how long each launcher takes to the first step.",
        "",
        "```{note}",
        f"This page is generated by `benchmarks/report.py` from `{source}` (one run on one machine);",
        "`make bench` measures again and rewrites it. Every ratio below comes from that single run.",
        "```",
        "",
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
                                            for n in ("overhead", "ddp_scaling", "collective", "first_step") if n in doc)
        + " |",
        "",
        _noise_sentence(doc, cores),
        "",
    ]


def _noise_sentence(doc: dict[str, Any], cores: int) -> str:
    """How quiet the machine was, in words, from the load average and the overhead spread."""
    samples = [doc["meta"].get("load_average_before"), doc["meta"].get("load_average_after")]
    samples += [doc[n].get("load_average_after") for n in ("overhead", "ddp_scaling", "collective", "first_step") if n in doc]
    load = max((s or [0])[0] for s in samples)
    spreads = [s["iqr_rel"] for s in doc.get("overhead", {}).get("steps_per_s", {}).values() if s.get("iqr_rel")]
    parts = [f"load average up to {load:.1f} on {cores} cores"]
    if spreads:
        parts.append(f"interquartile range of the overhead runs' steps/s {_pct(min(spreads))}–{_pct(max(spreads))}"
                     " of the median")
    if load > 0.5 * cores:
        return (f"**Noise:** the machine was shared with other jobs ({'; '.join(parts)}), so single measurements"
                " vary a lot. Read medians, spreads and the per-round ratios, which pair runs taken back to back.")
    return f"**Noise:** the machine was quiet ({'; '.join(parts)})."


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
        lines += ["", f"![Steps per second of the three variants](images/benchmarks/{image})"]
    return lines + [""]


def _ddp(ddp: dict[str, Any], image: str | None) -> list[str]:
    lines = ["## 2. DDP scaling, 1 vs 2 processes", ""]
    if "error" in ddp:
        return lines + [f"Failed: `{ddp['error']}`", ""]
    if "skipped" in ddp:
        return lines + [f"Skipped: {ddp['skipped']}.", ""]
    st = ddp["settings"]
    lines += [
        f"Weak scaling: the batch per process stays the same, so 2 processes do twice the work per step;"
        f" efficiency = steps/s with 2 processes ÷ steps/s with 1 (1.0 is perfect). Baseline: {st['baseline']};"
        f" scaled: {st['scaled']}; threads per process: {st['threads_per_process']}; {st['reps']} rounds"
        f" interleaved, {st['measured_steps']} timed steps after {st['warmup_steps']} warm-up steps.",
        "",
        "| workload | parameters | gradients per step | batch / process | steps/s, 1 process | steps/s, 2 processes"
        " | samples/s 1 → 2 | efficiency, per-round median [min–max] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in ddp["workloads"].items():
        w = r["workload"]
        s1, s2 = r["steps_per_s"]["1"], r["steps_per_s"]["2"]
        lines.append(
            f"| {name} | {w['params']:,} | {_size(w['grad_bytes'])} | {w['batch']} | {_spread(s1, '{:.1f}')} |"
            f" {_spread(s2, '{:.1f}')} | {r['samples_per_s']['1']:.0f} → {r['samples_per_s']['2']:.0f} |"
            f" {_spread(r['efficiency']['per_round'], '{:.2f}')} |"
        )
    backend = next(iter(ddp["workloads"].values())).get("backend")
    lines += ["", f"Backend: `{backend}`. The compute-bound model spends its step on matrix products; the"
              " communication-bound one all-reduces many gradients per sample, so its efficiency is bounded by"
              " the all_reduce bandwidth of section 3."]
    if image:
        lines += ["", f"![Weak-scaling efficiency](images/benchmarks/{image})"]
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
        lines += ["", f"![all_reduce and memcpy bandwidth](images/benchmarks/{image})"]
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
        lines += ["", f"![Time to first step per launcher](images/benchmarks/{image})"]
    return lines + [""]


def _footer() -> list[str]:
    return [
        "## Reproduce",
        "",
        "```bash",
        "make bench                      # all four benchmarks, then this page (about 10 min on 2 cores)",
        "make bench BENCH_ARGS=--quick   # smaller sizes, fewer rounds",
        "python -m benchmarks --only overhead,collective --out /tmp/mine.json --no-report",
        "```",
        "",
        "The device is the one `torch.accelerator` reports (CPU without one); the built-in comparison uses the"
        " accelerator named by the device table's `lightning_builtin` field, so the same code runs on a GPU"
        " machine. Results files (`benchmarks/results/*.json`) record the machine, versions, date and load;"
        " results from different machines are never combined in one ratio.",
        "",
    ]


def render(results: Path, page: Path = DOCS_PAGE, images: Path = IMAGES_DIR) -> list[Path]:
    """Write the plots and the docs page for ``results``; return the paths written."""
    doc = json.loads(Path(results).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{results} is not a {SCHEMA} results file")
    made = _plots(doc, images)
    try:
        source = Path(results).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        source = Path(results).name
    lines = _header(doc, source)
    sections = (("overhead", _overhead), ("ddp_scaling", _ddp), ("collective", _collective),
                ("first_step", _first_step))
    for name, fn in sections:
        if name in doc:
            lines += fn(doc[name], made.get(name))
    if not made:
        lines += ["(Plots were not drawn: matplotlib is not installed; `pip install -e .[bench]`.)", ""]
    lines += _footer()
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(lines))
    return [page, *(images / f for f in made.values())]


if __name__ == "__main__":
    for p in render(Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS_DIR / "latest.json"):
        print(p)
