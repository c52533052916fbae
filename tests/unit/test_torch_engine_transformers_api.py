"""The torch engine against the transformers API it runs on. The `train` extra allows transformers>=4.56,<6, and
`make test-transformers-floor` runs this file at both ends (4.56.2 and .venv's). Transformers 5.2x renamed the KV
cache from `past_key_values` to `cache` (the old name goes in 5.40), and says so on two channels:
- a FutureWarning (`deprecate_kwarg`) when a forward is called with the old keyword; it is attributed to the
  caller's frame (torch's Module.__call__), so a filter on module="transformers" would miss it;
- a log line, once per process (`logger.warning_once`), when the old field of a model output is read.
Sampling with a KV cache must trigger neither, on every architecture the tiny-random model offers."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engines.interface import Sampling
from engines.torch_engine import TorchEngine

torch.set_num_threads(1)


class RecordsHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def transformers_log() -> Iterator[list[logging.LogRecord]]:
    """The transformers library's warnings while the test runs. Its root logger does not propagate (caplog sees
    nothing), and warning_once remembers what it logged: cleared here, so a line an earlier test logged counts again."""
    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()
    logger = logging.getLogger("transformers")
    handler, old_level = RecordsHandler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)  # whatever TRANSFORMERS_VERBOSITY says
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3"])
def test_sampling_with_a_kv_cache_uses_no_deprecated_transformers_name(
    tmp_path: Path, architecture: str, transformers_log: list[logging.LogRecord]
) -> None:
    from services.learner.model_init import build_initial_policy
    from shared.config import ModelConfig
    from shared.tasks import TASKS

    config = ModelConfig(init="tiny-random", architecture=architecture)
    engine = TorchEngine(build_initial_policy(config, TASKS["arithmetic_mod10"].alphabet, tmp_path / architecture))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        # pyproject's filterwarnings ignores DeprecationWarning: these filters sit in front of it for this block
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        groups = engine.generate(["3+4=", "12+345="], Sampling(2, 4, 1.0))

    # a completion longer than one token: a decode step took the prefill's cache back
    assert max(len(sample.token_ids) for group in groups for sample in group) > 1
    deprecations = [record.getMessage() for record in transformers_log if "deprecated" in record.getMessage()]
    assert not deprecations, deprecations
