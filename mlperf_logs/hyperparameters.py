"""The submission and hyperparameter keys a closed-division ResNet log carries (ruleset 4.0.0)."""

from __future__ import annotations

from dataclasses import dataclass

from configs.shape import BatchShape
from mlperf_logs.logger import MLPerfLogger, constants
from optim.config import OptimConfig


@dataclass(frozen=True)
class Submission:
    org: str
    platform: str
    division: str
    status: str


@dataclass(frozen=True)
class Hyperparameters:
    optimizer: str  # lars | sgd
    global_batch: int
    grad_accum: int
    bn_span: int
    train_samples: int
    eval_samples: int
    base_lr: float
    end_lr: float
    poly_power: float
    decay_steps: int
    warmup_epochs: float
    momentum: float
    weight_decay: float

    @classmethod
    def of_run(
        cls, optim: OptimConfig, shape: BatchShape, decay_steps: int, train_samples: int, eval_samples: int
    ) -> Hyperparameters:
        """A run's keys: its optimizer section, how its batch is dealt, its schedule's decay in steps and the
        sizes of its splits."""
        return cls(
            optimizer=optim.name,
            global_batch=shape.global_batch,
            grad_accum=shape.grad_accum,
            bn_span=shape.bn_span,
            train_samples=train_samples,
            eval_samples=eval_samples,
            base_lr=optim.base_lr,
            end_lr=optim.end_lr,
            poly_power=optim.poly_power,
            decay_steps=decay_steps,
            warmup_epochs=optim.warmup_epochs,
            momentum=optim.momentum,
            weight_decay=optim.weight_decay,
        )


def log_submission(log: MLPerfLogger, submission: Submission) -> None:
    log.event(constants.SUBMISSION_BENCHMARK, "resnet")
    log.event(constants.SUBMISSION_ORG, submission.org)
    log.event(constants.SUBMISSION_DIVISION, submission.division)
    log.event(constants.SUBMISSION_STATUS, submission.status)
    log.event(constants.SUBMISSION_PLATFORM, submission.platform)


def log_hyperparameters(log: MLPerfLogger, hp: Hyperparameters) -> None:
    """The common keys, then the optimizer's own (LARS logs epsilon 0, as the reference does)."""
    log.event(constants.GLOBAL_BATCH_SIZE, hp.global_batch)
    log.event(constants.GRADIENT_ACCUMULATION_STEPS, hp.grad_accum)
    log.event(constants.TRAIN_SAMPLES, hp.train_samples)
    log.event(constants.EVAL_SAMPLES, hp.eval_samples)
    log.event(constants.MODEL_BN_SPAN, hp.bn_span)
    log.event(constants.OPT_NAME, hp.optimizer)
    prefix = hp.optimizer  # the ruleset names the optimizer keys lars_opt_* and sgd_opt_*
    log.event(f"{prefix}_opt_base_learning_rate", hp.base_lr)
    log.event(f"{prefix}_opt_end_learning_rate", hp.end_lr)
    log.event(f"{prefix}_opt_learning_rate_decay_poly_power", hp.poly_power)
    log.event(f"{prefix}_opt_learning_rate_decay_steps", hp.decay_steps)
    log.event(f"{prefix}_opt_momentum", hp.momentum)
    log.event(f"{prefix}_opt_weight_decay", hp.weight_decay)
    if hp.optimizer == "lars":
        log.event(constants.LARS_EPSILON, 0.0)
        log.event(constants.LARS_OPT_LEARNING_RATE_WARMUP_EPOCHS, hp.warmup_epochs)
    else:
        log.event(constants.OPT_LR_WARMUP_EPOCHS, hp.warmup_epochs)
