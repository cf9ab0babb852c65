"""What ``fedge list`` and ``fedge schema`` show, kept as data so they answer without importing torch.

``catalog.json`` (shipped in the package) holds every algorithm with its config keys (``fedge list
--algorithm``), every dataset, partitioner and model with its cut points, and ``schema.json`` the JSON
Schema of a run config with every built-in algorithm's block.
Both are built from the live registries by ``python -m fedge.intake.catalog``; a test checks that the files
equal what the registries say now, so a new component cannot be forgotten.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CATALOG = Path(__file__).with_name("catalog.json")
SCHEMA = Path(__file__).with_name("schema.json")
EXAMPLE_INPUTS = {
    "cse_cifar": (3, 24, 24),
    "vgg": (3, 32, 32),
    "resnet18": (3, 32, 32),
    "cnn4": (3, 32, 32),
    "cifar_cnn": (3, 32, 32),
    "gpt2": (16,),  # token sequences (the vocabulary is the catalog's 10 classes)
    "llama": (16,),
    "bert": (16,),  # token sequences, 10 labels
}


def build() -> dict[str, Any]:
    """The catalog from the registries (imports every component)."""
    from fedge.algorithms import ALGORITHMS
    from fedge.config import describe_fields
    from fedge.data.partition import PARTITIONERS
    from fedge.data.sources import source_descriptions
    from fedge.models import model_cut_points, model_descriptions

    models = []
    for name, description in model_descriptions().items():
        shape = EXAMPLE_INPUTS.get(name, (1, 28, 28))
        cuts = [[k, block] for k, block in model_cut_points(name, shape, 10)]
        models.append({"name": name, "description": description, "input": list(shape), "cuts": cuts})
    keys = {name: describe_fields(cls.config_class) for name, cls in sorted(ALGORITHMS.items())}
    return {
        "algorithms": {name: cls.description for name, cls in sorted(ALGORITHMS.items())},
        "algorithm_keys": json.loads(json.dumps(keys)),  # as the file holds them (tuples as lists)
        "datasets": source_descriptions(),
        "partitioners": dict(PARTITIONERS),
        "models": models,
    }


def load() -> dict[str, Any]:
    """The shipped catalog."""
    return json.loads(CATALOG.read_text())


def build_schema() -> dict[str, Any]:
    """The JSON Schema of a run config from the registries (imports every algorithm)."""
    import fedge.algorithms  # noqa: F401  (fills the registry)
    from fedge.config import json_schema

    return json_schema()


def load_schema() -> dict[str, Any]:
    """The shipped JSON Schema (fedge's own algorithms)."""
    return json.loads(SCHEMA.read_text())


if __name__ == "__main__":
    CATALOG.write_text(json.dumps(build(), indent=1) + "\n")
    SCHEMA.write_text(json.dumps(build_schema(), indent=1) + "\n")
    print(f"wrote {CATALOG} and {SCHEMA}")
