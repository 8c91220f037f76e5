r"""Parity on a transformer: N processes of DDP train a small GPT-2 as one device does (the validation kit).

The same comparison as :mod:`lightning_anyaccel.kit.tools.parity`, on the model the kit's ``transformer`` check
trains (a 2-block GPT-2 built from its config, nothing downloaded) instead of the MLP: the serial run on one
device with the whole global batch (:func:`reference_run`, plain torch) against DDP on N processes, each
with its share of the rows (:class:`Gpt2ParityModule` inside ``Trainer.fit``), ``parity.STEPS`` steps of SGD
with momentum and gradient clipping. Dropout is off (each rank would draw its own masks) and the position
embeddings are frozen (they must stay bit-identical). Files, under the ``out`` folder given::

    <out>/reference.pt          the serial fp32 run (the bf16 validity gate compares with it)
    <out>/reference-bf16.pt     the serial bf16-mixed run, where the precision is bf16-mixed
    <out>/ddp/rank<N>.pt        what rank N saw, as full tensors

``parity_run.judge(out, "ddp", N, precision)`` compares them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from lightning_anyaccel.kit.tools import parity

if TYPE_CHECKING:
    from lightning_anyaccel.accelerator import AnyAccelerator

#: Tokens per row and rows per rank and step: each rank's share of a step is ``PER_RANK_BATCH`` distinct rows.
TOKENS, PER_RANK_BATCH = 32, 2


def build_gpt2() -> Any:
    """The kit's GPT-2 (2 blocks, 64 wide, bytes as tokens), seeded, without dropout, position embeddings frozen."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    net = GPT2LMHeadModel(config)
    net.transformer.wpe.requires_grad_(False)  # frozen: must stay bit-identical
    return net


def dataset(world_size: int) -> TensorDataset:
    """``parity.STEPS`` global batches of ``world_size * PER_RANK_BATCH`` rows of random byte tokens, all distinct."""
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randint(0, 256, (parity.STEPS * world_size * PER_RANK_BATCH, TOKENS), generator=generator))


def _loss(net: Any, tokens: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy of ``tokens`` (every row has as many tokens: the mean of the ranks' means)."""
    return net(input_ids=tokens, labels=tokens).loss


def reference_run(device: torch.device | str, world_size: int, precision: str = "32-true") -> list[dict[str, Any]]:
    """The serial run: the whole global batch per step on one ``device``, plain torch (as ``parity_run.reference_run``)."""
    device = torch.device(device)
    net = build_gpt2().to(device)
    trainable = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in trainable], lr=parity.LR, momentum=0.9)
    steps = []
    for (tokens,) in DataLoader(dataset(world_size), batch_size=world_size * PER_RANK_BATCH, shuffle=False):
        tokens = tokens.to(device)
        before = {n: parity.host(p) for n, p in trainable}
        optimizer.zero_grad()
        with torch.autocast(device.type, torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss = _loss(net, tokens)
        loss.float().backward()
        record = parity.StepRecord(grads={n: parity.host(p.grad) for n, p in trainable if p.grad is not None})
        record.norm_before = parity.global_norm(record.grads)
        torch.nn.utils.clip_grad_norm_([p for _, p in trainable], parity.CLIP)
        record.norm_after = parity.global_norm({n: parity.host(p.grad) for n, p in trainable if p.grad is not None})
        optimizer.step()
        record.update = {n: parity.host(p) - before[n] for n, p in trainable}
        record.frozen = {n: parity.host(p) for n, p in net.named_parameters() if not p.requires_grad}
        steps.append(record.as_dict())
    return steps


class Gpt2ParityModule(parity.ParityModule):
    """:func:`build_gpt2` trained by DDP, each step recorded as full tensors (:attr:`steps`), as
    :class:`~lightning_anyaccel.kit.tools.parity.ParityModule` records the MLP; ``control`` breaks it on purpose
    (``drop_rank_grad``, ``sum_grads``, ``skip_update``)."""

    def __init__(self, control: str = "none") -> None:
        super().__init__(control)
        self.net = build_gpt2()  # replaces the MLP: the recording hooks read every parameter of the module

    @override
    def train_dataloader(self) -> DataLoader[Any]:
        from torch.utils.data.distributed import DistributedSampler

        data = dataset(self.trainer.world_size)
        sampler: DistributedSampler[Any] = DistributedSampler(data, num_replicas=self.trainer.world_size,
                                                              rank=self.trainer.global_rank, shuffle=False)
        return DataLoader(data, batch_size=PER_RANK_BATCH, sampler=sampler)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (tokens,) = batch
        loss = _loss(self.net, tokens)
        self.losses.append(float(loss.detach()))
        return parity.controlled_loss(loss, self.control, self.global_rank, self.trainer.world_size)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.param_device, self.batch_device = str(next(self.parameters()).device), str(batch[0].device)
        self._before = self.full_tensors()
        self._record = parity.StepRecord()


def fit(accelerator: AnyAccelerator, devices: int, precision: str, control: str,
        out: Path) -> tuple[Any, Gpt2ParityModule]:
    """Train DDP on ``devices`` processes ``parity.STEPS`` steps; write this rank's steps to ``out/ddp/rank<N>.pt``."""
    from lightning.pytorch import Trainer

    from lightning_anyaccel.kit.tools.parity_run import build_strategy

    model = Gpt2ParityModule(control)
    trainer = Trainer(accelerator=accelerator, strategy=build_strategy("ddp"), devices=devices,
                      precision=precision,  # type: ignore[arg-type]  # a str of its literals
                      max_steps=parity.STEPS, gradient_clip_val=parity.CLIP, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0, use_distributed_sampler=False)
    trainer.fit(model)
    (out / "ddp").mkdir(parents=True, exist_ok=True)
    torch.save(model.steps, out / "ddp" / f"rank{trainer.global_rank}.pt")
    return trainer, model


def rank(accelerator: AnyAccelerator, devices: int, precision: str, control: str,
         out: Path) -> tuple[Any, Gpt2ParityModule]:
    """One process of the GPT-2's parity (the validation kit's ``transformer`` check): the launching process first
    runs the serial references on device 0 (fp32, and bf16-mixed where ``precision`` is), then each of the
    ``devices`` processes trains DDP (:func:`fit`); the files are the module's, under ``out``."""
    if parity.launching():
        out.mkdir(parents=True, exist_ok=True)
        device = accelerator.spec.device(0)
        torch.save(reference_run(device, devices), out / "reference.pt")
        if precision == "bf16-mixed":
            torch.save(reference_run(device, devices, "bf16-mixed"), out / "reference-bf16.pt")
    return fit(accelerator, devices, precision, control, out)


__all__ = ["Gpt2ParityModule", "build_gpt2", "dataset", "fit", "rank", "reference_run"]
