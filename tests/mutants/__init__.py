"""Broken variants of each paper's mechanism, one module per chapter (tests/mutants/<slug>.py).

Each module lists its mutants in MUTANTS: functions that patch the paper's module in place
(module attributes or class methods), each with a docstring saying what it breaks. They live in
the tests, never in the package. `make mutants` (tools/seeds_and_mutants.py) executes every chapter
once per mutant, the patch applied right after the setup cell, and requires the chapter to stop
on its claim check: a mutant that no claim catches means the claims are too weak.
"""
