"""The trainers' own keys: which mean what a NeMo-RL key means (docs/semantics.md §13).

Each integration (``async_tee.integrations``) tees a trainer's logged dicts under the
trainer's own prefix. There, a key an alias names is recorded into the ``rl.*`` series a
NeMo-RL key of the same meaning feeds, so one dashboard shows every trainer; a key under the
trainer's phase prefix is a step phase; every other key is recorded as it was logged, into
``rl.logged.value{rl.trainer, rl.key}``, up to ``ASYNC_TEE_TRAINER_KEYS`` keys (256).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TrainerKeys:
    """How one trainer's dicts are read.

    Attributes:
        prefix: The tee prefix its integration logs under; also its ``rl.trainer``.
        aliases: ``(trainer key, rl.* series name)`` in order; when one dict holds two
            keys of one series, the later pair's value is the one recorded.
        phase_prefix: Keys under it are the step's phases (``rl.step.phase.duration``,
            the phase being the rest of the key), but for a key an alias reads.
    """

    prefix: str
    aliases: tuple[tuple[str, str], ...]
    phase_prefix: str = ""

    @property
    def read_by_alias(self) -> frozenset[str]:
        """The keys an alias reads (never passed through)."""
        return frozenset(key for key, _ in self.aliases)


TRANSFORMERS = TrainerKeys(
    "transformers",
    (
        # transformers.Trainer's own, every logging step
        ("loss", "rl.policy.loss"),
        ("grad_norm", "rl.grad_norm"),
        ("learning_rate", "rl.learning_rate"),
        # TRL's GRPOTrainer (and its RLOO/online trainers' names where they agree)
        ("reward", "rl.reward.mean"),
        ("kl", "rl.kl.divergence"),
        ("entropy", "rl.entropy"),
        ("completions/mean_length", "rl.response.length.mean"),
        ("completions/clipped_ratio", "rl.truncation.ratio"),
        ("step_time", "rl.step.duration"),
    ),
)
"""Hugging Face ``Trainer``'s ``on_log`` dicts, TRL's trainers' included."""

LIGHTNING = TrainerKeys(
    "lightning",
    (
        # A LightningModule names its own keys: the common spellings, the more specific last.
        ("loss", "rl.policy.loss"),
        ("train_loss", "rl.policy.loss"),
        ("train_loss_step", "rl.policy.loss"),
        ("train/loss", "rl.policy.loss"),
        ("reward", "rl.reward.mean"),
        ("train/reward", "rl.reward.mean"),
        ("kl", "rl.kl.divergence"),
        ("train/kl", "rl.kl.divergence"),
        ("entropy", "rl.entropy"),
        ("train/entropy", "rl.entropy"),
        ("grad_norm", "rl.grad_norm"),
        ("train/grad_norm", "rl.grad_norm"),
        ("lr", "rl.learning_rate"),
        ("learning_rate", "rl.learning_rate"),
    ),
)
"""Lightning's ``Logger.log_metrics`` dicts: what a module logged with ``self.log``."""

VERL = TrainerKeys(
    "verl",
    (
        ("critic/score/mean", "rl.reward.mean"),  # the task's score, before any KL penalty
        ("critic/kl", "rl.kl.divergence"),  # the KL penalty in the reward (PPO)
        ("actor/kl_loss", "rl.kl.divergence"),  # the KL loss to the reference (GRPO)
        ("actor/pg_loss", "rl.policy.loss"),
        ("critic/vf_loss", "rl.value.loss"),
        ("actor/entropy", "rl.entropy"),
        ("actor/grad_norm", "rl.grad_norm"),
        ("actor/lr", "rl.learning_rate"),
        ("response_length/mean", "rl.response.length.mean"),
        ("response_length/clip_ratio", "rl.truncation.ratio"),
        ("perf/throughput", "rl.throughput.tokens.per_gpu"),
        ("timing_s/step", "rl.step.duration"),
    ),
    phase_prefix="timing_s/",
)
"""verl's ``Tracking.log`` dicts (``RayPPOTrainer.fit``: one dict a step)."""

TRAINERS = (TRANSFORMERS, LIGHTNING, VERL)
"""Every trainer an integration tees, by prefix."""
