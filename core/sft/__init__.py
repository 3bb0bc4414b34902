"""Supervised fine-tuning: conversations as token ids with the loss on the assistant's tokens (``data``), packed
into rows without cross-contamination, and the loss of a packed batch (``packing``)."""

from core.sft.data import Sample, conversation_sample, conversations, read_rows
from core.sft.packing import Packed, collate, pack, token_nll

__all__ = ["Packed", "Sample", "collate", "conversation_sample", "conversations", "pack", "read_rows", "token_nll"]
