"""The command-line tools: headlab-train, -compare, -status, -heads, -eval, -sync, -bench; arguments.py checks
their options as they are parsed."""
