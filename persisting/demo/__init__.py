"""The demo ``./dev demo`` runs: ``run.py`` (embedded, broker, arena), ``rl.py`` (its RL step)."""
