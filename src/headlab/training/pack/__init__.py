"""Packs: many runs of one architecture (seeds, optimizer settings) trained as one vectorized model in one process.

Every member stays a run: built exactly as its single run (member.py), fed its own batches side by side
(data.py), trained on its single run's objective with its own AdamW settings (module.py), writing what its
single run writes (writer.py), analysed with the others at once (analysis.py), on one device or several (ranks.py: DDP);
train.py puts them together.
"""
