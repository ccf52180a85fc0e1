"""The trainers RL users run, teed as NeMo-RL's ``Logger`` is (docs/semantics.md §13).

One module per trainer, each imported by its user (importing ``async_tee`` imports none):

- :mod:`async_tee.integrations.transformers`: ``AsyncTeeCallback``, a ``TrainerCallback``
  for Hugging Face ``Trainer`` and the trainers built on it (TRL's ``GRPOTrainer``, ...);
- :mod:`async_tee.integrations.lightning`: ``AsyncTeeLogger``, a Lightning ``Logger``;
- :mod:`async_tee.integrations.verl`: ``AsyncTeeBackend``, a verl ``Tracking`` backend, and
  ``install()``, which adds it to every ``Tracking`` (verl's list of backends is closed).
"""
