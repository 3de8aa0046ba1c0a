"""The trace child: the process that imports torch and the user's code, and traces its step.

``launcher.estimate`` is the API the planner calls (``traced.trace_recipe``, the footprints,
the analytic formulas); it starts this package as ``python -m
launcher.estimate.child._trace_child`` (``estimate/trace_process.py``) and reads its answers.
Nothing here is imported by the parent side: what the two share is data (``trace_result``,
``_blocks``' depth scaling), which this package imports from ``launcher.estimate``, never the
other way (``tests/test_imports.py``). ``_trace_child``'s docstring says which module does what.
"""
