"""Data: ``core.data.prepare`` writes verl-schema parquet; ``core.data.dataset`` reads it back (ours or verl's)."""
