"""The prompts of a run, step after step: endless batches over the data's rows, reshuffled each epoch, whose
position a checkpoint holds."""

from __future__ import annotations

import random


class PromptStream:
    """Endless batches of ``per_step`` rows. Epoch e's order is a shuffle seeded by (seed, e), so the position
    is two integers that a checkpoint holds (``state``) and a resumed run continues from."""

    def __init__(self, rows: list[dict], per_step: int, shuffle: bool, seed: int, epoch: int = 0, index: int = 0):
        self.rows, self.per_step, self.shuffle, self.seed = rows, per_step, shuffle, seed
        self.epoch, self.index = epoch, index
        self._order: tuple[int, list[int]] | None = None

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, state: dict) -> None:
        """Continue from a checkpoint's ``state()``."""
        self.epoch, self.index = state["epoch"], state["index"]

    def __iter__(self):
        return self

    def __next__(self) -> list[dict]:
        if self.index + self.per_step > len(self.rows):  # the epoch's remainder is dropped
            self.epoch, self.index = self.epoch + 1, 0
        if self._order is None or self._order[0] != self.epoch:
            order = list(range(len(self.rows)))
            if self.shuffle:
                random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
            self._order = (self.epoch, order)
        batch = [self.rows[j] for j in self._order[1][self.index:self.index + self.per_step]]
        self.index += self.per_step
        return batch
