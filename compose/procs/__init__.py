"""Child processes: ``service`` spawns a subcommand and waits until it is ready (and picks free
ports), ``headless`` runs an agent CLI isolated and bounded.
"""
