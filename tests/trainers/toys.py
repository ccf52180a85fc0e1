"""Toy runs of the real trainers on CPU, built here: no hub, no download, a few seconds each.

A test module imports this one at its top (``from trainers.toys import ...``): without the
heavy packages (.ci/trainers.txt) its tests skip, or fail where CI requires them
(``trainers.required``). Each run returns the trainer and what recorded its logs: a
``LogRecorder`` callback (Hugging Face) or a ``RecordingLogger`` (Lightning) holding every
``(step, metrics)`` the trainer logged. verl's toy is in ``trainers.verl_toys``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from trainers.required import require

# The runs are local: no Hub calls, no telemetry thread, no progress bars. huggingface_hub reads
# these when first imported (tests/conftest.py sets them too, for any import order).
for _name in ("HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_PROGRESS_BARS"):
    os.environ.setdefault(_name, "1")

for _module in ("torch", "transformers", "trl", "datasets", "tokenizers", "lightning"):
    require(_module)

import huggingface_hub.constants  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

if not huggingface_hub.constants.HF_HUB_OFFLINE:
    raise RuntimeError("huggingface_hub was imported online: import trainers.toys before it")

WORDS = [
    *("the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far"),
    *("big", "small", "red", "blue", "one", "two", "three"),
]
SPECIAL = ["<pad>", "<unk>", "<s>", "</s>"]
PROMPTS = ["the cat sat", "a dog ran", "the big red", "one two three"]

Steps = list[tuple[int, dict[str, Any]]]
"""What a recorder holds: ``(step, metrics)`` per call, in order."""


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``WORDS`` (pad, unk, bos and eos set), built here."""
    vocab = {word: i for i, word in enumerate([*SPECIAL, *WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )


def tiny_lm(seed: int = 0) -> LlamaForCausalLM:
    """A one-layer Llama of hidden size 16 over the tokenizer's vocabulary, from a config."""
    config = LlamaConfig(
        vocab_size=len(SPECIAL) + len(WORDS),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


class LogRecorder(TrainerCallback):  # type: ignore[misc]
    """Every ``on_log`` call: ``(state.global_step, a copy of logs)``."""

    def __init__(self) -> None:
        self.steps: Steps = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        self.steps.append((state.global_step, dict(logs or {})))


def length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """The completion's length in words."""
    return [float(len(completion.split())) for completion in completions]


def cat_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """How often the completion says "cat"."""
    return [float(completion.split().count("cat")) for completion in completions]


class HfRun(NamedTuple):
    """A finished Hugging Face run: the trainer and its ``on_log`` calls."""

    trainer: Trainer
    logged: Steps


def _train(trainer: Trainer, recorder: LogRecorder) -> HfRun:
    trainer.remove_callback(PrinterCallback)  # disable_tqdm puts it there: it prints each log
    trainer.train()
    return HfRun(trainer, recorder.steps)


def _every_step_on_cpu(output_dir: Path, steps: int) -> dict[str, Any]:
    """What every toy HF run sets: ``steps`` steps of 2 on CPU, each logged; no save, no report."""
    return {
        "output_dir": str(output_dir),
        "max_steps": steps,
        "logging_steps": 1,
        "per_device_train_batch_size": 2,
        "use_cpu": True,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 0,
    }


def run_grpo(
    callbacks: Sequence[TrainerCallback],
    output_dir: Path,
    steps: int = 3,
    beta: float = 0.04,
    reward_funcs: Sequence[Callable[..., list[float]]] = (length_reward, cat_reward),
) -> HfRun:
    """A real ``trl.GRPOTrainer`` on the tiny LM for ``steps`` steps, logging every step.

    Two prompts' completions (``num_generations`` 2, up to 8 tokens) per step, the reward
    functions' ``rewards/<name>/mean`` keys among the logs. ``beta`` > 0 loads a reference
    model (from the tiny LM saved in ``output_dir``) and logs ``kl``; TRL's default is 0.
    """
    model_dir = output_dir / "model"
    tiny_lm().save_pretrained(model_dir)
    recorder = LogRecorder()
    args = GRPOConfig(
        **_every_step_on_cpu(output_dir, steps),
        num_generations=2,
        max_completion_length=8,
        beta=beta,
        bf16=False,
        gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer(),
        callbacks=[recorder, *callbacks],
    )
    return _train(trainer, recorder)


def run_hf_trainer(callbacks: Sequence[TrainerCallback], output_dir: Path, steps: int = 3) -> HfRun:
    """A plain ``transformers.Trainer`` (causal LM loss) on the tiny LM for ``steps`` steps."""
    tok = tokenizer()
    texts = [f"{prompt} {word}" for prompt in PROMPTS for word in ("cat", "dog")]
    encoded = tok(texts, padding="max_length", max_length=6)
    labels = [
        [token if token != tok.pad_token_id else -100 for token in ids]
        for ids in encoded["input_ids"]
    ]
    dataset = Dataset.from_dict({**encoded, "labels": labels})
    recorder = LogRecorder()
    args = TrainingArguments(**_every_step_on_cpu(output_dir, steps))
    trainer = Trainer(
        model=tiny_lm(), args=args, train_dataset=dataset, callbacks=[recorder, *callbacks]
    )
    return _train(trainer, recorder)


class RecordingLogger(pl.loggers.Logger):  # type: ignore[misc]
    """A minimal Lightning logger: its ``log_metrics`` calls, hyperparameters, finalize statuses."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: Steps = []
        self.hyperparams: list[dict[str, Any]] = []
        self.finalized: list[str] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.steps.append((-1 if step is None else step, dict(metrics)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        self.hyperparams.append(dict(vars(params) if hasattr(params, "__dict__") else params))

    def finalize(self, status: str) -> None:
        self.finalized.append(status)


class ToyModule(pl.LightningModule):  # type: ignore[misc]
    """A linear regression that logs ``train/loss``, ``reward`` and ``kl`` every step."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.linear = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.linear(x), y)
        self.log("train/loss", loss)
        self.log("reward", -loss.detach())
        self.log("kl", 0.01 * (batch_idx + 1))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


@contextmanager
def _lightning_warnings() -> Iterator[None]:
    # lightning 2.6.6 calls torch's pytree LeafSpec(), deprecated in torch 2.15 (a FutureWarning
    # from typing_extensions.deprecated, attributed to lightning's _pytree.py) on each fit.
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
            category=FutureWarning,
            module=r"lightning\.pytorch\.utilities\._pytree",
        )
        yield


class LightningRun(NamedTuple):
    """A finished Lightning run: the trainer and the ``RecordingLogger`` beside its loggers."""

    trainer: pl.Trainer
    recorder: RecordingLogger


def run_lightning(
    logger: pl.loggers.Logger | Sequence[pl.loggers.Logger],
    output_dir: Path,
    steps: int = 3,
    callbacks: Sequence[pl.Callback] = (),
) -> LightningRun:
    """A real ``lightning.Trainer`` fitting ``ToyModule`` for ``steps`` steps on CPU.

    ``logger`` (one or several) after a ``RecordingLogger``; a ``LearningRateMonitor`` logs
    ``lr-SGD`` too, before ``callbacks``.
    """
    recorder = RecordingLogger()
    loggers = [logger] if isinstance(logger, pl.loggers.Logger) else list(logger)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4 * steps, 4), torch.randn(4 * steps, 1))
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=[recorder, *loggers],
        callbacks=[pl.callbacks.LearningRateMonitor(), *callbacks],
        default_root_dir=str(output_dir),
    )
    with _lightning_warnings():
        trainer.fit(ToyModule(), torch.utils.data.DataLoader(data, batch_size=4))
    return LightningRun(trainer, recorder)
