"""Capture: a script the user already has, run as it is up to where its training starts.

One package, one protocol, whatever the script is (a Hugging Face ``Trainer``, accelerate or
Lightning script, or a plain PyTorch loop):

- ``frameworks.py``, the parent's side: which kind of script it is (``detect``, from its text
  alone), the capture child run with the script's own arguments in a process group of its own
  (``capture``; ``inspect_framework`` and ``inspect_plain`` turn its answer into a
  ``ScriptInfo``), the framework's own real step measured (``measure_step``), and the script's
  own settings in the plan (``own_settings``, ``own_steps``);
- ``child/``, the child's side (``python -m launcher.capture.child``): hooks on each kind's entry
  points, and what was found written as it is found (``capture.json``, the model with meta
  weights, one batch, the optimizer's settings);
- ``recipe_template.py``, copied beside each capture: a launch recipe (``build_model``,
  ``example_batch``, ``training_step``, ``build_optimizer``) that the estimator traces like any
  recipe, made of what the script itself built.

A recipe written for launch is not captured: ``launcher/recipe.py`` probes it (its hooks are the
protocol).
"""
