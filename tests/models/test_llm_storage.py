"""The frozen base in storage and in the memory pre-flight: once per device and once per process, never
once per client or per server copy."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from llm_cases import lm_config, write_corpus  # noqa: E402

import fedge  # noqa: E402
from fedge.errors import ConfigError  # noqa: E402
from fedge.runner import preflight  # noqa: E402
from fedge.runner.loop import build_run  # noqa: E402

H, VOCAB, POSITIONS = 32, 256, 16  # llm_cases' tiny GPT-2: 2 blocks x 32, byte vocabulary, 16 positions
BLOCK = 12 * H * H + 13 * H  # ln_1, ln_2 (2h each), c_attn (3h^2 + 3h), c_proj (h^2 + h), MLP (8h^2 + 5h)
CLIENT_BASE = 32 * (VOCAB * H + POSITIONS * H + BLOCK)  # embeddings + block 1, fp32
SERVER_BASE = 32 * (BLOCK + 2 * H + VOCAB * H)  # block 2 + final norm + the head (tied to wte)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def storage_after_a_round(raw: dict) -> dict[str, dict[str, int]]:
    built = build_run(fedge.resolve_config(raw))
    built.algorithm.run_round(1)
    return {node: dict(held) for node, held in built.context.ledger.storage.items()}


def test_splitfed_v1_server_copies_are_adapters_over_one_base(corpus):
    storage = storage_after_a_round(lm_config(corpus, {"name": "splitfed_v1"}))
    server_adapters = 32 * 4 * (H + 3 * H)  # LoRA r = 4 on block 2's c_attn
    assert storage["server"]["frozen_base"] == SERVER_BASE  # once, for 3 server copies
    assert storage["server"]["server_model"] == 3 * server_adapters
    for k in range(3):
        assert storage[f"client:{k}"]["frozen_base"] == CLIENT_BASE
        assert storage[f"client:{k}"]["model"] == 32 * 4 * (H + 3 * H)


@pytest.mark.parametrize("name", ["light_fedsl", "cse_fsl"])
def test_split_devices_hold_their_side_of_the_base_once(corpus, name):
    storage = storage_after_a_round(lm_config(corpus, {"name": name}))
    assert storage["server"]["frozen_base"] == SERVER_BASE
    assert all(storage[f"client:{k}"]["frozen_base"] == CLIENT_BASE for k in range(3))


def test_fedavg_devices_hold_the_whole_base_once(corpus):
    storage = storage_after_a_round(lm_config(corpus, {"name": "fedavg"}))
    whole = 32 * (VOCAB * H + POSITIONS * H + 2 * BLOCK + 2 * H)  # the head tied to wte: once
    assert {held["frozen_base"] for held in storage.values()} == {whole}
    assert len(storage) == 4


def test_full_fine_tuning_holds_no_frozen_base(corpus):
    full = {"options": {"layers": 2, "hidden": H, "heads": 2, "lora_rank": 0}}
    storage = storage_after_a_round(lm_config(corpus, {"name": "splitfed_v2"}, model=full))
    assert not any("frozen_base" in held for held in storage.values())


def test_the_preflight_counts_the_frozen_base_once_and_refuses_what_it_does_not_leave_room_for(
    corpus, monkeypatch
):
    options = {"layers": 6, "hidden": 256, "heads": 4}  # a base of 6 x 12 x 256^2 values and more
    raw = lm_config(corpus, {"name": "splitfed_v1"}, model={"options": options}, eval={"batch_size": 8})
    config = fedge.resolve_config(raw)
    monkeypatch.setattr(preflight, "available_bytes", lambda device: None)
    data = build_run(config).context.data
    parts = preflight.state_parts(config, data)
    bases = [part for part in parts if "frozen base" in part.what]
    assert len(bases) == 1  # once, for 3 clients and 3 server copies
    assert bases[0].bytes >= 4 * 6 * 12 * 256 * 256
    others = sum(part.bytes for part in parts) - bases[0].bytes
    room = others + bases[0].bytes // 2  # everything but the base fits
    monkeypatch.setattr(preflight, "available_bytes", lambda device: room)
    with pytest.raises(ConfigError, match="frozen base") as error:
        build_run(config)
    assert error.value.key == "model" and "\n" not in str(error.value)
