"""The capture child: runs a framework script as ``__main__`` up to where training would start.

``python -m launcher.capture.child --script train.py --out DIR --kind hf_trainer -- ARGS``
runs ``train.py ARGS`` with hooks on the framework's entry points (``launcher.capture.frameworks``
has the why). Each hook takes the model, optimizer, batch and settings, writes them to ``DIR`` and
raises ``Stop`` (a BaseException, so the script's own ``except Exception`` cannot swallow it):

- ``capture.json``: what was found (``reached``: the hook ran), the step's recipe
  (``step``), the optimizer's class and settings, the framework's settings, the script's own
  values for the plan (``launch``, with where each was found: ``own``) and how long it trains by
  itself (``length``: max steps, epochs of its loader's batches, an accelerate loop's bounds),
  notes;
- ``model.pkl``: the model, pickled with every parameter (and any tensor over 16 MiB) as a
  ``meta`` tensor of its shape and dtype (``launcher.capture.frameworks.meta_tensor``); small
  buffers keep their values (a rotary embedding's frequencies);
- ``batch.pt``: one batch from the framework's own dataloader (after its collator), the largest
  its data makes where its batches vary in shape (``data_bound``, with a note);
- ``config.json``: the config of the largest Hugging Face model built on the way, written as
  soon as it is built, so a script that never reaches training still has an analytic estimate.

``from_pretrained`` without local weights (the child runs offline) builds the model from its
config at random init and says so in a note. With ``--measure`` the hook instead lets the
framework train for two optimizer steps under the CPU profiler and writes ``measure.json``: the
framework's own step, which the traced estimate is checked against.

The package, one job per module: ``__main__`` (the entry: arguments, the script run as
``__main__``, its errors as notes), ``answer`` (``capture.json`` and the state the hooks share),
``capture`` (what is written: the model, the batch, the optimizer's settings), ``hf``,
``lightning`` and ``accelerate`` (each framework's hooks), ``plain`` (a plain PyTorch loop;
``batch_dim``: which dimension of its batch is the batch, ``manual_step``: a loop that updates
its weights by hand),
``data_bound`` (the largest batch the training data makes, where its batches vary in shape: the
batch traced instead of the first), ``measure`` (``--measure``: the framework's own step under
the CPU profiler).
"""
