"""Data: ``core.data.prepare`` writes verl-schema parquet; ``core.data.dataset`` reads it back (ours or verl's);
``core.data.arith`` generates the CPU demo's arithmetic task with a test split held out by content; ``core.data.dapo_math``
reads DAPO-Math-17k (the DAPO and VAPO papers' training set)."""
