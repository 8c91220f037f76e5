import torch
from torch import nn
import lightning as L


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        keep = torch.rand(x.shape[0], 1, device=x.device) > 0.1  # drop 10% of the samples
        loss = nn.functional.cross_entropy(self.net(x) * keep, y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    data = torch.utils.data.TensorDataset(x, x[:, :4].argmax(dim=1))
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
    trainer = L.Trainer(accelerator="auto", devices=1, max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Classifier(), loader)
    print(f"trained {trainer.global_step} steps on {trainer.strategy.root_device}")
