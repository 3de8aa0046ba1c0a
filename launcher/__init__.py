"""launcher: estimate, plan, render and launch PyTorch training that does not run out of memory."""

__version__ = "0.1.0"
