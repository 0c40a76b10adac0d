"""Issue #7's character-level text task: normalisation, the paper's word rule, spelling accuracy, entropy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BENCHMARK_DATA, TINY, compose_config

from mdmkit.core.errors import ConfigError
from mdmkit.evaluation.runner import sample_split
from mdmkit.samplers.rules.speculative import WindowSampler
from mdmkit.tasks.chars import ALPHABET, CharTextTask, normalize, unigram_entropy, words
from mdmkit.training.preflight import plan_training
from mdmkit.training.train import run_training

DOCS = [doc for i in range(40) for doc in (
    {"question": f"Tom has {i} apples. How many <<1+{i}={i + 1}>> apples?",
     "answer": f"He has {i} apples.\n#### {i}"},
    {"question": f"Ann buys {i + 12} pens for ${i}.",
     "answer": f"Each pen costs {i}/{i + 12} dollars.\n#### {i}"},
)]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    with open(tmp_path / "gsm8k_train.jsonl", "w") as file:
        file.writelines(json.dumps(doc) + "\n" for doc in DOCS)
    return tmp_path


def _task(data_dir: Path, **fields) -> CharTextTask:
    return CharTextTask(data_dir=str(data_dir), length=16, n_train=50, n_val=5, n_test=8, **fields)


def test_normalize_keeps_a_small_lowercase_alphabet() -> None:
    text = normalize("Tom  has <<1+2=3>>3\n\nAPPLES; é!\n#### 3")
    assert text == "tom has 3 apples ! answer: 3"
    assert set(text) <= set(ALPHABET)


def test_words_follow_the_papers_rule() -> None:
    assert words("he has 3 apples, and 4b pens.") == ["he", "has", "apples", "and", "pens"]
    assert words("lo he has 3 apples, and pens", interior=True) == ["he", "has", "apples", "and"]
    assert words("one", interior=True) == []


def test_unigram_entropy_of_known_histograms() -> None:
    assert unigram_entropy("aaaa") == 0.0
    assert unigram_entropy("abab") == pytest.approx(math.log(2))
    assert unigram_entropy("abcd") == pytest.approx(math.log(4))


def test_spelling_accuracy_pools_every_interior_word(data_dir: Path) -> None:
    task = _task(data_dir)
    assert {"tom", "apples", "pen", "costs", "answer"} <= task.dictionary
    texts = ["x tom zzq apples", "y pen costs qq z"]  # interior words: tom, zzq | pen, costs, qq
    predicted = torch.from_numpy(np.stack([task.encode(t.ljust(16)) for t in texts]))
    metrics = task.sample_metrics(predicted)
    assert metrics["words"] == 5 and metrics["spelling_accuracy"] == pytest.approx(3 / 5)
    entropies = [unigram_entropy(t.ljust(16)) for t in texts]
    assert metrics["unigram_entropy"] == pytest.approx(np.mean(entropies))
    assert task.score(predicted, predicted, predicted > -1).tolist() == [False, False]
    good = torch.from_numpy(task.encode("a tom has pens b"))[None]
    assert task.score(good, good, good > -1).tolist() == [True]


def test_windows_come_from_the_corpus_and_are_all_answer(data_dir: Path) -> None:
    task = _task(data_dir)
    splits = task.load_splits()
    assert [len(splits[s]) for s in ("train", "val", "test")] == [50, 5, 8]
    test = splits["test"]
    assert bool(test.answer_mask.all())
    assert all(task.decode(row) in task.corpus for row in test.tokens)
    assert task.sample_metrics(test.tokens)["spelling_accuracy"] == 1.0  # real text spells right by design
    with pytest.raises(ConfigError, match="task gsm8k_chars reads no test_file"):  # was a bare NotImplementedError
        _task(data_dir, test_file=str(data_dir / "gsm8k_train.jsonl"))


def test_real_gsm8k_text_spells_right_and_noise_does_not() -> None:
    if not (BENCHMARK_DATA / "gsm8k_train.jsonl").is_file():
        pytest.skip(f"no GSM8K training file under {BENCHMARK_DATA}")
    task = CharTextTask(data_dir=str(BENCHMARK_DATA), n_train=10, n_val=5, n_test=5)
    assert len(task.corpus) > 3_000_000 and len(task.dictionary) > 10_000
    real = torch.from_numpy(task.generate(64, seed=1).tokens)
    noise = torch.randint(0, len(ALPHABET), real.shape, generator=torch.Generator().manual_seed(0))
    assert task.sample_metrics(real)["spelling_accuracy"] == 1.0
    assert task.sample_metrics(noise)["spelling_accuracy"] < 0.8
    assert task.sample_metrics(noise)["unigram_entropy"] > task.sample_metrics(real)["unigram_entropy"]


def test_evaluation_rows_carry_the_text_metrics(data_dir: Path) -> None:
    task = _task(data_dir)
    split = task.load_splits()["test"]

    class Uniform(torch.nn.Module):  # every character equally likely: a sampler draws uniform noise
        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(()))

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            logits = torch.zeros(*tokens.shape, task.vocab_size)
            logits[..., task.mask_id] = -math.inf
            return logits

    sampler = WindowSampler(window_param=0.25, ordering="random", temperature=1.0)
    summary = sample_split(Uniform(), task, split, sampler, batch_size=4, seed=0).summary()
    assert {"spelling_accuracy", "unigram_entropy", "words"} <= set(summary)
    assert summary["unigram_entropy"] > 2.0  # 16 uniform draws over 52 characters rarely repeat


@pytest.mark.parametrize("experiment", ["text_mdm", "text_speculative"])
def test_text_experiments_train_and_report_spelling(tmp_path: Path, data_dir: Path, experiment: str) -> None:
    tiny = [o for o in TINY if not o.startswith(("model=", "task.workers"))]
    model = ["model=tiny"] if experiment == "text_mdm" else ["model=speculative_tiny"]
    config = compose_config("train", [*tiny, f"experiment={experiment}", *model, f"task.data_dir={data_dir}",
                                      "task.length=16", "eval_limit=8",
                                      f"results_file={tmp_path}/rows.jsonl"])
    summary = run_training(plan_training(config), tmp_path / "run")
    assert summary["global_step"] == 4 and summary["n"] == 8
    spelling = summary["spelling_accuracy"]
    assert (spelling is None) == (summary["words"] == 0) and (spelling is None or 0.0 <= spelling <= 1.0)
    assert summary["unigram_entropy"] > 0.0
