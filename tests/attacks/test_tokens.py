"""Token recovery from hidden states at the cut on known answers: at cut 0 (the embedding itself) every
token comes back, after two random frozen transformer layers most still do, and from hidden states that
carry no token the attack is at chance."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fedge.attacks.tokens import recover_tokens, token_accuracy, train_token_inversion

VOCABULARY, LENGTH, WIDTH = 40, 8, 16
Encode = Callable[[torch.Tensor], torch.Tensor]


@pytest.fixture(scope="module")
def embedding() -> nn.Embedding:
    torch.manual_seed(0)
    return nn.Embedding(VOCABULARY, WIDTH).requires_grad_(False)


@pytest.fixture(scope="module")
def tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """The attacker's auxiliary sequences and the victim's, drawn independently."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(VOCABULARY, (200, LENGTH), generator=g), torch.randint(
        VOCABULARY, (100, LENGTH), generator=g
    )


def attack(encode: Encode, embedding: nn.Embedding, tokens: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The token accuracy of an inversion trained on the auxiliary sequences, on the victim's."""
    auxiliary, victim = tokens
    inversion = train_token_inversion(
        encode, auxiliary, embedding.weight, epochs=20, generator=torch.Generator().manual_seed(2)
    )
    return token_accuracy(recover_tokens(inversion, encode(victim), embedding.weight), victim)


def test_the_embedding_itself_gives_every_token_back(embedding, tokens):
    assert attack(embedding, embedding, tokens) > 0.95


def test_two_random_transformer_layers_keep_most_tokens(embedding, tokens):
    torch.manual_seed(3)
    positions = torch.randn(LENGTH, WIDTH, generator=torch.Generator().manual_seed(4))
    layers = nn.Sequential(
        *(nn.TransformerEncoderLayer(WIDTH, 2, 32, dropout=0.0, batch_first=True) for _ in range(2))
    )
    layers.eval().requires_grad_(False)
    accuracy = attack(lambda t: layers(embedding(t) + positions), embedding, tokens)
    assert accuracy > 10 / VOCABULARY


def test_hidden_states_without_tokens_give_chance(embedding, tokens):
    g = torch.Generator().manual_seed(5)
    accuracy = attack(lambda t: torch.randn(*t.shape, WIDTH, generator=g), embedding, tokens)
    assert abs(accuracy - 1 / VOCABULARY) < 0.03


def test_token_accuracy_leaves_masked_positions_out():
    recovered, truth = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 2, 0, 0]])
    assert token_accuracy(recovered, truth) == 0.5
    assert token_accuracy(recovered, truth, mask=torch.tensor([[True, True, False, False]])) == 1.0
    with pytest.raises(ValueError, match="mask is all false"):
        token_accuracy(recovered, truth, mask=torch.zeros(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="differ in shape"):
        token_accuracy(recovered, truth[:, :2])


def test_an_encoder_of_the_wrong_shape_is_refused(embedding, tokens):
    with pytest.raises(ValueError, match="encode gave"):
        train_token_inversion(lambda t: embedding(t).flatten(1), tokens[0], embedding.weight, epochs=1)
