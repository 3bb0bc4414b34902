"""verl's command lines, run here: the key table (``keys``), the translation with verl's semantics (``translate``), a
verl script's final command line (``script``), the CLI (``run``: ``hybridrl train --verl``, ``convert-verl``), the
docs page (``docs``) and the survey of verl's example scripts (``corpus``)."""
