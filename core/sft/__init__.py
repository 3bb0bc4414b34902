"""Supervised fine-tuning: conversations as token ids with the loss on the assistant's tokens (``data``), packed
into rows without cross-contamination (``packing``); the loss of a packed batch is ``core.train.sft_loss``'s."""

from core.sft.data import Sample, conversation_sample, conversations, read_rows
from core.sft.packing import Packed, collate, pack

__all__ = ["Packed", "Sample", "collate", "conversation_sample", "conversations", "pack", "read_rows"]
