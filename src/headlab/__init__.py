"""headlab: train transformer encoders that differ only in how attention is split into heads."""

__version__ = "0.1.0"
