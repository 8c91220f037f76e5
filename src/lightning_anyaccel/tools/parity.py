"""Parity: do N processes compute what one device computes?

A parity run trains the same model from the same initial weights on the same rows for ``k`` optimizer
steps twice: serially on one device with the whole global batch (:func:`serial_reference`), and with a
multi-process strategy where each rank takes its slice of the batch. Per step the run records the global
gradient norm before and after clipping, per trainable tensor the gradient (before clipping) and the update (weights after
the step minus before), and at the end every frozen tensor (:class:`StepRecord`). :func:`compare` judges
the run against the reference: every value must satisfy ``|run - ref| <= atol + rtol * |ref|`` and every
frozen tensor must be bit-identical; the first failure names the step, the quantity and the tensor.

    >>> ref = [{"norm_before": 2.0, "norm_after": 1.0, "grads": {"w": [1.0]}, "update": {"w": [-0.1]}}]
    >>> compare(ref, ref, {"f": [1.0]}, {"f": [1.0]}).ok
    True
    >>> halved = [{**ref[0], "grads": {"w": [0.5]}}]
    >>> compare(ref, halved, {}, {}).failure
    'step 0: grads of w differ: 0.5 vs reference 1 (relative difference 0.5, tolerance rtol 1e-05 atol 1e-06)'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: fp32 tolerance: N processes sum the same products in another order (the all-reduce); measured
#: differences on CPU are below 1e-6 relative, so 1e-5 leaves a margin without hiding a lost rank (0.5).
FP32_RTOL = 1e-5
FP32_ATOL = 1e-6

StepRecord = dict[str, Any]


@dataclass
class ParityResult:
    """The verdict of :func:`compare`: the largest relative difference per quantity, and the first failure."""

    max_rel: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    rtol: float = FP32_RTOL
    atol: float = FP32_ATOL

    @property
    def ok(self) -> bool:
        return self.failure is None

    def as_record(self) -> dict[str, Any]:
        """What a record keeps of the verdict."""
        return {"ok": self.ok, "max_rel": self.max_rel, "rtol": self.rtol, "atol": self.atol, "failure": self.failure}


def _values(x: Any) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64).flatten()


def _check(result: ParityResult, where: str, ref: Any, run: Any) -> None:
    a, b = _values(ref), _values(run)
    quantity = where.split(":", 1)[1].strip().split(" ")[0] if ":" in where else where
    if a.shape != b.shape:
        result.failure = result.failure or f"{where}: shape {tuple(b.shape)} vs reference {tuple(a.shape)}"
        return
    diff = (a - b).abs()
    rel = float((diff / a.abs().clamp_min(result.atol)).max()) if a.numel() else 0.0
    result.max_rel[quantity] = max(result.max_rel.get(quantity, 0.0), rel)
    bad = diff > result.atol + result.rtol * a.abs()
    if result.failure is None and bool(bad.any()):
        i = int(bad.nonzero()[0])
        result.failure = (f"{where} differ: {float(b[i]):.6g} vs reference {float(a[i]):.6g} (relative difference "
                          f"{float(diff[i] / a[i].abs().clamp_min(result.atol)):.3g}, tolerance rtol {result.rtol:g}"
                          f" atol {result.atol:g})")


def compare(reference: Sequence[StepRecord], run: Sequence[StepRecord], frozen_ref: Mapping[str, Any],
            frozen_run: Mapping[str, Any], *, rtol: float = FP32_RTOL, atol: float = FP32_ATOL) -> ParityResult:
    """Judge ``run`` (per-step records of N processes) against ``reference`` (one device)."""
    result = ParityResult(rtol=rtol, atol=atol)
    if len(run) != len(reference):
        result.failure = f"{len(run)} steps recorded, the reference has {len(reference)}"
        return result
    for step, (ref, got) in enumerate(zip(reference, run)):
        for quantity in ("grads", "norm_before", "norm_after", "update"):
            if quantity.startswith("norm"):
                _check(result, f"step {step}: {quantity}", ref[quantity], got[quantity])
                continue
            missing = set(ref[quantity]) ^ set(got[quantity])
            if missing and result.failure is None:
                result.failure = f"step {step}: {quantity} of {sorted(missing)} recorded on one side only"
            for name in sorted(set(ref[quantity]) & set(got[quantity])):
                _check(result, f"step {step}: {quantity} of {name}", ref[quantity][name], got[quantity][name])
    for name in sorted(frozen_ref):
        if result.failure is None and _values(frozen_ref[name]).tolist() != _values(frozen_run.get(name, [])).tolist():
            result.failure = f"frozen parameter {name} is not bit-identical to the reference"
    return result


def global_norm(grads: Iterable[torch.Tensor]) -> float:
    """The 2-norm over every gradient, as ``clip_grad_norm_`` computes it."""
    norms = [g.detach().double().norm(2) for g in grads]
    return float(torch.stack(norms).norm(2)) if norms else 0.0


def serial_reference(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *, lr: float,
                     max_norm: float) -> tuple[list[StepRecord], dict[str, list[float]]]:
    """Train ``model`` on one device, one whole global batch per step, with SGD and clipping by norm."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.SGD(params.values(), lr=lr)
    steps: list[StepRecord] = []
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads = {n: p.grad.flatten().tolist() for n, p in params.items() if p.grad is not None}
        before = global_norm(p.grad for p in params.values() if p.grad is not None)
        torch.nn.utils.clip_grad_norm_(list(params.values()), max_norm)
        after = global_norm(p.grad for p in params.values() if p.grad is not None)
        old = {n: p.detach().clone() for n, p in params.items()}
        optimizer.step()
        steps.append({"norm_before": before, "norm_after": after,
                      "grads": grads,
                      "update": {n: (p.detach() - old[n]).flatten().tolist() for n, p in params.items()}})
    frozen = {n: p.detach().flatten().tolist() for n, p in model.named_parameters() if not p.requires_grad}
    return steps, frozen
