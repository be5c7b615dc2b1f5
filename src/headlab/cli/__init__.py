"""The command-line tools: headlab-train, headlab-compare, headlab-heads, headlab-bench."""
