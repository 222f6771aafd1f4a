"""A stored batch, as every reader and writer of batches agrees on it: ``recipe`` (a recipe of
assets/batches.yaml, refused at load when it would make every batch useless), ``names`` (where a
recipe's tables and exports live), ``manifest`` (what an export wrote, read by trainers),
``pins`` (what a batch was planned from) and ``rows`` (its rows in export order, completed
from ``turns``). It imports no planner, exporter, trainer or inspector: those build on it."""
