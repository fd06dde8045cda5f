"""Shared by the backends' weight-update tests: manifests that must be refused before anything loads."""


def bad_manifests(shapes: dict) -> dict:
    """error word -> a manifest with that one problem (the backends' messages name it)."""
    first = next(iter(shapes))
    return {"shape": {**shapes, first: (3,)},
            "no such weight": {**shapes, "model.layers.99.mlp.up_proj.weight": (3,)},
            "misses": {k: v for k, v in shapes.items() if k != first}}


def recording_producer(named: dict, drawn: list):
    """Perturbed tensors, noting each name as it is drawn (a refused manifest must draw none)."""
    for k, v in named.items():
        drawn.append(k)
        yield k, v + 1.0
