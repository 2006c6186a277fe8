"""A small model with every awkward feature the wrappers must handle, and rank-side helpers."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM = 50, 16


class ToyModel(nn.Module):
    """Tied embedding/head, a frozen layer, a buffer, and a branch that is never used."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.fc1 = nn.Linear(DIM, 32)
        self.fc2 = nn.Linear(32, DIM)
        self.frozen = nn.Linear(DIM, DIM)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("scale", torch.tensor(1.5))

    def forward(self, ids):
        h = self.embed(ids) * self.scale
        h = torch.relu(self.fc1(h))
        h = self.fc2(h)
        h = h + self.frozen(h)
        return self.head(h)


def make_model(seed: int) -> ToyModel:
    torch.manual_seed(seed)
    m = ToyModel()
    with torch.no_grad():
        m.scale.fill_(1.0 + seed % 7)  # a different buffer per seed, so the broadcast is visible
    if seed != 0:
        m.scale.fill_(3.0)
    else:
        m.scale.fill_(1.5)
    return m


def batches(steps: int, batch: int = 8, seq: int = 6):
    g = torch.Generator().manual_seed(1234)
    return [(torch.randint(0, VOCAB, (batch, seq), generator=g), torch.randint(0, VOCAB, (batch, seq), generator=g))
            for _ in range(steps)]


def loss_fn(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def make_opt(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
