r"""The comparison of parity (:mod:`lightning_anyaccel.kit.tools.parity`): a run's steps against the serial run's.

:func:`compare` (fp32, element-wise) and :func:`compare_bf16` (bf16-mixed, per tensor, behind a validity
gate) raise :class:`~lightning_anyaccel.kit.tools.parity.ParityError` naming the rank, step and tensor that
differ, or return the :class:`ParityReport` of the largest differences measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lightning_anyaccel.kit.tools.parity import ATOL, BF16_GATE, BF16_RTOL, RTOL, ParityError


@dataclass(frozen=True)
class ParityReport:
    """The largest relative differences a run showed against the reference, and the tolerance it met.

    Attributes:
        strategy: the strategy's name.
        steps: optimizer steps compared.
        norm: the largest relative difference of the global gradient norm (before or after clipping).
        grad: the largest ``|a - b| / (|b| + atol / rtol)`` over every gradient element, ranks and steps
            (a tensor passes ``torch.isclose`` where this is at most ``rtol``).
        update: the same over every update element.
        rtol: the relative tolerance met (with ``atol``).
        atol: the absolute tolerance met.
    """

    strategy: str
    steps: int
    norm: float
    grad: float
    update: float
    rtol: float
    atol: float

    def as_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "steps": self.steps, "norm": self.norm, "grad": self.grad,
                "update": self.update, "rtol": self.rtol, "atol": self.atol}

    def line(self) -> str:
        return (f"{self.strategy}: {self.steps} steps, largest relative difference: grad norm {self.norm:.1e},"
                f" gradients {self.grad:.1e}, updates {self.update:.1e} (tolerance rtol {self.rtol:g}, atol {self.atol:g})")


def _relative(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> tuple[float, int]:
    """The largest ``|got - want| / (|want| + atol / rtol)`` and where (flat index)."""
    scaled = (got.double() - want.double()).abs() / (want.double().abs() + atol / rtol)
    index = int(scaled.argmax()) if scaled.numel() else 0
    return (float(scaled.flatten()[index]) if scaled.numel() else 0.0), index


def compare(strategy: str, reference: list[dict[str, Any]], ranks: list[list[dict[str, Any]]],
            rtol: float = RTOL, atol: float = ATOL) -> ParityReport:
    """Every rank's view of every step against the serial reference; :class:`ParityError` on the first difference.

    A tensor passes where ``|got - want| <= atol + rtol * |want|`` element-wise (``torch.isclose``); a frozen
    tensor must be bit-identical; the gradient norms before and after clipping within ``rtol``.
    """
    if not ranks:
        raise ParityError(f"{strategy}: no rank reported")
    largest = {"norm": 0.0, "grads": 0.0, "update": 0.0}
    for rank, steps in enumerate(ranks):
        if len(steps) != len(reference):
            raise ParityError(f"{strategy}: rank {rank} made {len(steps)} optimizer steps, the reference {len(reference)}")
    for step, want in enumerate(reference):  # the earliest step that differs, on any rank, is the one named
        for rank, steps in enumerate(ranks):
            got, where = steps[step], f"{strategy}, rank {rank}, step {step + 1}"
            for key in ("grads", "update"):
                if set(got[key]) != set(want[key]):
                    raise ParityError(f"{where}: {key} of {sorted(got[key])}, the reference has {sorted(want[key])}")
                for name, expected in want[key].items():
                    value = got[key][name]
                    if value.shape != expected.shape:
                        raise ParityError(f"{where}: {key} of tensor {name} has shape {tuple(value.shape)},"
                                          f" the reference {tuple(expected.shape)}")
                    difference, index = _relative(value, expected, rtol, atol)
                    largest[key] = max(largest[key], difference)
                    if not torch.isclose(value, expected, rtol=rtol, atol=atol).all():
                        raise ParityError(f"{where}: {'gradient' if key == 'grads' else 'update'} of tensor {name}"
                                          f" differs: element {index} is {float(value.flatten()[index]):.8g}, one"
                                          f" device computed {float(expected.flatten()[index]):.8g} (relative"
                                          f" difference {difference:.2e}, tolerance rtol {rtol:g} atol {atol:g})")
                if key == "update":
                    continue
                for norm in ("norm_before", "norm_after"):  # after the gradients: a wrong one names its tensor
                    difference = abs(got[norm] - want[norm]) / max(abs(want[norm]), atol / rtol)
                    largest["norm"] = max(largest["norm"], difference)
                    if difference > rtol:
                        raise ParityError(f"{where}: global gradient {norm.replace('_', ' ')} clipping is"
                                          f" {got[norm]:.8g}, one device computed {want[norm]:.8g}"
                                          f" (relative difference {difference:.2e})")
            for name, expected in want["frozen"].items():
                if name not in got["frozen"] or not torch.equal(got["frozen"][name], expected):
                    raise ParityError(f"{where}: frozen tensor {name} changed (it must stay bit-identical)")
    return ParityReport(strategy, len(reference), largest["norm"], largest["grads"], largest["update"], rtol, atol)


def _l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-12))


def compare_bf16(strategy: str, reference: list[dict[str, Any]], fp32: list[dict[str, Any]],
                 ranks: list[list[dict[str, Any]]], rtol: float = BF16_RTOL) -> ParityReport:
    """bf16-mixed parity: every rank against the serial bf16-mixed run, per tensor by relative 2-norm.

    The validity gate comes first: the serial bf16 run must differ from the serial fp32 run (``fp32``)
    by :data:`BF16_GATE` or more in some gradient, or the device did not compute in bf16 and a match
    would prove nothing (``ParityError``). Frozen tensors must stay bit-identical.
    """
    effect = max(_l2(b["grads"][n], f["grads"][n]) for b, f in zip(reference, fp32) for n in b["grads"])
    if effect < BF16_GATE:
        raise ParityError(f"{strategy}: the serial bf16-mixed run equals the fp32 run (largest relative difference"
                          f" {effect:.1e} < {BF16_GATE:g}): autocast did not compute in bf16, the check proves nothing")
    largest = {"norm": 0.0, "grads": 0.0, "update": 0.0}
    for step, want in enumerate(reference):
        for rank, steps in enumerate(ranks):
            if len(steps) != len(reference):
                raise ParityError(f"{strategy}: rank {rank} made {len(steps)} steps, the reference {len(reference)}")
            got, where = steps[step], f"{strategy} (bf16-mixed), rank {rank}, step {step + 1}"
            for key in ("grads", "update"):
                for name, expected in want[key].items():
                    difference = _l2(got[key][name], expected)
                    largest[key] = max(largest[key], difference)
                    if difference > rtol:
                        raise ParityError(f"{where}: {'gradient' if key == 'grads' else 'update'} of tensor {name}"
                                          f" differs from one device's bf16 run by {difference:.2e} (relative"
                                          f" 2-norm, tolerance {rtol:g})")
            for norm in ("norm_before", "norm_after"):
                difference = abs(got[norm] - want[norm]) / abs(want[norm])
                largest["norm"] = max(largest["norm"], difference)
                if difference > rtol:
                    raise ParityError(f"{where}: global gradient {norm.replace('_', ' ')} clipping is {got[norm]:.6g},"
                                      f" one device's bf16 run {want[norm]:.6g}")
            for name, expected in want["frozen"].items():
                if not torch.equal(got["frozen"][name], expected):
                    raise ParityError(f"{where}: frozen tensor {name} changed (it must stay bit-identical)")
    return ParityReport(strategy, len(reference), largest["norm"], largest["grads"], largest["update"], rtol, 0.0)


__all__ = ["ParityReport", "compare", "compare_bf16"]
