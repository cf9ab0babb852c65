"""No padding reaches a language model: documents are packed into full windows (a short tail dropped),
so every token a model reads is a real token of its document at its place; a short last batch is filled
with rows of weight 0 that the loss and the ledger skip (tests/algorithms/test_llm_light_fedsl.py,
test_llm_split.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from llm_cases import lm_config  # noqa: E402

import fedge  # noqa: E402
from fedge.runner.loop import build_run  # noqa: E402

SEQ = 16
LENGTHS = (SEQ + 1, 3 * SEQ + 9, 5 * SEQ + 1 + SEQ - 1, 4 * SEQ + 2)  # tails of 0, 8, 15 and 1 tokens


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """Four files whose token counts leave short tails; the bytes of each."""
    root = tmp_path_factory.mktemp("ragged")
    texts = []
    for f, length in enumerate(LENGTHS):
        rng = np.random.default_rng(f)
        text = "".join(chr(c) for c in rng.integers(97, 123, size=length))  # ASCII: one byte a token
        (root / f"doc{f}.txt").write_text(text)
        texts.append(np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64))
    return root, texts


def test_every_window_is_a_full_slice_of_its_document(documents):
    root, texts = documents
    raw = lm_config(root, {"name": "splitfed_v2"}, clients=4)
    data = build_run(fedge.resolve_config(raw)).context.data.dataset
    for group, tokens in enumerate(texts):
        windows = [
            torch.cat([x[groups == group], y[groups == group][:, -1:]], dim=1)
            for x, y, groups in (
                (data.x_train, data.y_train, torch.as_tensor(data.train_groups)),
                (data.x_test, data.y_test, torch.as_tensor(data.test_groups)),
            )
        ]
        rows = torch.cat(windows).numpy()  # train windows, then the held-out tail's
        count = (len(tokens) - 1) // SEQ
        assert rows.shape == (count, SEQ + 1)
        for i, row in enumerate(rows):  # window i: tokens i*SEQ .. (i+1)*SEQ, none made up
            assert np.array_equal(row, tokens[i * SEQ : (i + 1) * SEQ + 1])
        assert len(tokens) - (count * SEQ + 1) < SEQ  # only a short tail is left out


@pytest.mark.parametrize("name", ["splitfed_v2", "light_fedsl"])
def test_the_model_reads_only_real_windows(documents, name):
    """Every row of every batch the model reads in training and evaluation is a packed window."""
    root, _ = documents
    raw = lm_config(root, {"name": name, "batch_size": 8}, clients=4, engine={"executor": "sequential"})
    built = build_run(fedge.resolve_config(raw))
    data = built.context.data.dataset
    windows = {tuple(row) for row in torch.cat([data.x_train, data.x_test]).tolist()}
    seen: list[torch.Tensor] = []
    first = built.algorithm.parts.model.block1
    hook = first.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    try:
        built.algorithm.run_round(1)
        built.algorithm.evaluate()
    finally:
        hook.remove()
    rows = torch.cat([batch.reshape(-1, SEQ) for batch in seen])
    assert len(rows) >= len(data.x_test)
    assert all(tuple(row) in windows for row in rows.tolist())
