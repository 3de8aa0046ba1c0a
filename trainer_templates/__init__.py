"""Jinja templates for the training scripts that ``launch`` renders, one per strategy.

``<strategy>.py.j2`` is a whole script (``single.py.j2``, ``ddp.py.j2``); files starting with ``_``
are the parts they share and are never rendered on their own. The templates only choose *which
code* a script contains: every value (batch sizes, learning rate, paths) is read by the rendered
script from ``plan.json`` at run time, so the templates are rendered with an empty context.

The rendered scripts must stay runnable where ``launcher`` is not installed (a cloud container):
they import only the standard library, ``torch`` and the user's recipe. This package therefore holds
data, not code; ``launcher.render`` loads it with ``jinja2.PackageLoader``.
"""
