"""``python -m persisting.demo`` (what ``./dev demo`` runs): see ``run.py``."""

from .run import main

main()
