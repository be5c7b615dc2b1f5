"""Comparing runs, as a library: an analysis (analysis: the options, checked into a Design) and the runs' sources
(sources) to a report (report: compare.md, compare.csv, compare.json, figures, tables over datasets), replayed
from the runs' archives by check. headlab-compare is its arguments and what it prints."""
