"""``anyaccel-benchmark-summary``: one sentence per device from ``benchmarks/results/<type>.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.util.docutils import SphinxDirective
from support_tables import inline


class BenchmarkSummary(SphinxDirective):
    """One sentence per device from ``benchmarks/results/<type>.json``: what the plugin costs over Lightning."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        import json

        results = sorted((Path(self.env.srcdir) / "benchmarks" / "results").glob("*.json"))
        items = nodes.bullet_list()
        for path in results:
            self.env.note_dependency(str(path))
            doc = json.loads(path.read_text(encoding="utf-8"))
            sentence = _benchmark_sentence(doc, path.stem)
            if sentence:
                item = nodes.list_item()
                item += inline(sentence)
                items += item
        return [items] if len(items) else [inline("No benchmark results in `benchmarks/results/` yet.")]


def _benchmark_sentence(doc: dict[str, Any], device_type: str) -> str:
    """``cuda`` (NVIDIA H200, 2026-11-26): one device 1.01 x Lightning's own accelerator ..., GPT-2 1.00 x ..."""
    meta, overhead = doc.get("meta", {}), doc.get("overhead", {})
    ratio = overhead.get("ratios", {}).get("plugin/builtin", {}).get("per_round")
    if not ratio:
        return ""
    device = meta.get("device", {})
    where = f"`{device_type}` ({device.get('name', device_type)}, {str(meta.get('date', ''))[:10]})"
    parts = [f"{where}: on one device the plugin ran at {ratio['median']:.2f} x the steps per second of "
             f"Lightning's own accelerator (median of {ratio['n']} rounds; single rounds "
             f"{ratio['min']:.2f}-{ratio['max']:.2f})"]
    calls = overhead.get("calls_per_step", {})
    if calls.get("plugin") and calls.get("plugin") == calls.get("builtin"):
        parts.append(f"with exactly the same number of Python calls per step ({calls['plugin']:,.0f})")
    transformer = doc.get("transformer", {})
    gpt2 = transformer.get("ratios", {}).get("plugin/builtin", {}).get("per_round")
    if gpt2:
        parts.append(f"GPT-2 ({transformer['workload']['name']}): {gpt2['median']:.3f} x Lightning's tokens per"
                     f" second (rounds {gpt2['min']:.3f}-{gpt2['max']:.3f})")
    strategies = doc.get("strategies", {})
    ddp = strategies.get("families", {}).get("ddp", {}).get("ratios", {}).get("plugin/lightning", {}).get("per_round")
    if ddp:
        procs = strategies.get("settings", {}).get("processes", 2)
        parts.append(f"DDP with {procs} process{'es' if procs != 1 else ''}: {ddp['median']:.2f} x Lightning's DDP")
    return "; ".join(parts) + "."
