"""engine.generation.weights without a model: whole-set checks, manifest checks, lazy streaming."""
import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from memr1.engine.generation.backend import Backend
from memr1.engine.generation.config import GeneratorConfig
from memr1.engine.generation.weights import (ManifestStream, buckets, check_manifest, check_named_tensors, push_weights,
                                             stream)

EXPECTED = {"model.embed_tokens.weight": (8, 4), "a": (4, 4), "b": (4,), "c": (2, 4)}
ALIASES = {"lm_head.weight": "model.embed_tokens.weight"}
CPU = torch.device("cpu")


def named(shapes=EXPECTED):
    return [(k, torch.ones(s)) for k, s in shapes.items()]


class Producer:
    """Makes each tensor on demand and remembers, by a weak reference to the storage only (a detached
    alias shares it), the ones it handed out: `max_live` is the most earlier tensors whose memory was
    still held when a new one was asked for."""

    def __init__(self, pairs):
        self.pairs, self.refs, self.drawn, self.max_live = pairs, [], 0, 0

    def __iter__(self):
        for name, t in self.pairs:
            self.max_live = max(self.max_live, sum(not r.expired() for r in self.refs))
            self.drawn += 1
            fresh = t.clone() if isinstance(t, torch.Tensor) else t
            if isinstance(fresh, torch.Tensor):
                self.refs.append(StorageWeakRef(fresh.untyped_storage()))
            yield name, fresh
            del fresh


def test_check_named_tensors_names_every_problem():
    bad = named()[:-1] + [("a", torch.ones(4, 4)), ("zzz", torch.ones(1)), ("lm_head.weight", torch.ones(3))]
    with pytest.raises(ValueError, match="nothing was loaded") as e:
        check_named_tensors(bad, EXPECTED)
    for word in ("a: given twice", "zzz: no such weight", "lm_head.weight: shape", "missing 1 weights"):
        assert word in str(e.value)
    keep = check_named_tensors(named() + [("lm_head.weight", torch.ones(8, 4))], EXPECTED)
    assert [n for n, _ in keep] == list(EXPECTED)  # the tied alias is accepted and skipped


@pytest.mark.parametrize("manifest, word", [
    ({**EXPECTED, "zzz": (1,)}, "zzz: no such weight"),
    ({**EXPECTED, "a": (4, 5)}, "a: shape"),
    ({k: v for k, v in EXPECTED.items() if k != "b"}, "misses 1 weights"),
    ({**EXPECTED, "lm_head.weight": (8, 5)}, "lm_head.weight: shape"),
    ([("a", (4, 4))], "must be a dict"),
])
def test_bad_manifest_raises_before_drawing_anything(manifest, word):
    producer = Producer(named())
    with pytest.raises(ValueError, match=word) as e:
        ManifestStream(producer, manifest, EXPECTED)
    assert producer.drawn == 0
    if isinstance(manifest, dict):
        assert "nothing was loaded" in str(e.value)


def test_manifest_accepts_the_tied_alias_and_drops_it():
    manifest = {"lm_head.weight": [8, 4], **EXPECTED}  # lists are fine: shapes become tuples
    assert check_manifest(manifest, EXPECTED, ALIASES)["lm_head.weight"] == (8, 4)
    checked = ManifestStream([("lm_head.weight", torch.ones(8, 4))] + named(), manifest, EXPECTED)
    assert [n for n, _ in checked] == list(EXPECTED)
    checked.raise_if_broken()


@pytest.mark.parametrize("pairs, word", [
    (named()[:2] + [("b", torch.ones(5))] + named()[3:], "b: shape"),
    (named()[:2] + [("b", torch.ones(4, dtype=torch.long))] + named()[3:], "not floating point"),
    (named()[:2] + [("a", torch.ones(4, 4))] + named()[2:], "a: given twice"),
    (named()[:2] + [("lm_head.weight", torch.ones(8, 4))] + named()[2:], "not in the manifest"),
    (named()[:2] + [("b", [1.0] * 4)] + named()[3:], "not a tensor"),
    (named()[:3], "ended without 1 manifest weights"),
])
def test_a_stream_breaking_its_manifest_stops_and_reports(pairs, word):
    producer = Producer(pairs)
    checked = ManifestStream(producer, EXPECTED, EXPECTED)
    got = [n for n, _ in checked]
    assert got == [n for n, _ in pairs[:len(got)]] and len(got) <= 3
    with pytest.raises(ValueError, match=word) as e:
        checked.raise_if_broken()
    assert "partly updated" in str(e.value)
    if word != "ended without 1 manifest weights":
        assert producer.drawn == 3  # stopped at the bad tensor, drew nothing after it


def test_a_failing_producer_is_reported_with_a_note():
    def producer():
        yield named()[0]
        raise RuntimeError("gather failed")

    checked = ManifestStream(producer(), EXPECTED, EXPECTED)
    assert len(list(checked)) == 1
    with pytest.raises(RuntimeError, match="gather failed") as e:
        checked.raise_if_broken()
    assert any("partly updated" in note for note in e.value.__notes__)


def test_streaming_holds_one_bucket_not_the_model():
    pairs = [(f"w{i}", torch.ones(256, 1024)) for i in range(12)]  # 1 MiB each in fp32
    shapes = {n: (256, 1024) for n, _ in pairs}
    producer = Producer(pairs)
    checked = ManifestStream(producer, shapes, shapes)
    for name, t in stream(checked, 2, CPU, torch.float32):
        pass  # the loop variable still holds the last tensor when the next one is drawn
    checked.raise_if_broken()
    assert producer.drawn == 12 and producer.max_live <= 2  # a 2 MiB bucket: at most 2 alive
    del name, t
    collected = Producer(pairs)
    check_named_tensors(collected, shapes)  # without a manifest every tensor is held at once
    assert collected.max_live == 11


def test_buckets_are_bounded_and_complete():
    tensors = [(f"w{i}", torch.ones(256, 1024)) for i in range(10)]  # 1 MiB each in fp32
    got = list(buckets(tensors, 3, CPU, torch.float32))
    assert [len(b) for b in got] == [3, 3, 3, 1]
    assert got[0][0][1].data_ptr() == tensors[0][1].data_ptr()  # same device and dtype: no copy
    halves = list(buckets(tensors, 3, CPU, torch.bfloat16))
    assert [len(b) for b in halves] == [6, 4] and halves[0][0][1].dtype == torch.bfloat16
    assert [n for n, _ in stream(tensors, 3, CPU, torch.float32)] == [n for n, _ in tensors]


class Exporter:
    """A learner's weight side: pairs made on demand, and their manifest."""

    def __init__(self, pairs):
        self.producer, self.shapes = Producer(pairs), {n: tuple(t.shape) for n, t in pairs}

    def export_weights(self):
        return iter(self.producer)

    def weight_manifest(self):
        return self.shapes


class Receiver(Backend):
    """A backend with no engine: it notes the names it loads."""

    def __init__(self, shapes, bucket_mb):
        self.cfg, self.shapes, self.loaded = GeneratorConfig(weight_bucket_mb=bucket_mb), shapes, []

    def named_shapes(self):
        return self.shapes

    def weight_target(self):
        return CPU, torch.float32

    def load_weights(self, tensors):
        for name, t in tensors:
            self.loaded.append(name)


def test_push_weights_moves_pairs_in_the_generators_buckets():
    pairs = [(f"w{i}", torch.ones(256, 1024)) for i in range(12)]  # 1 MiB each in fp32
    learner = Exporter(pairs)
    gen = Receiver(learner.shapes, bucket_mb=2)
    assert push_weights(learner, gen, 3) == 12 * 2**20  # the bytes exported, for the loop's sync_bytes
    assert gen.loaded == list(learner.shapes) and gen.weight_version == 3 and not gen.needs_weights
    assert learner.producer.max_live <= 2  # one 2 MiB generator bucket alive, never the model


def test_push_weights_refuses_a_broken_export_and_leaves_the_generator_refusing():
    pairs = [(f"w{i}", torch.ones(4)) for i in range(6)]
    learner = Exporter(pairs)
    learner.producer.pairs = pairs[:3] + [("w3", torch.ones(5))] + pairs[4:]  # a shape the manifest did not say
    gen = Receiver(learner.shapes, bucket_mb=1)
    with pytest.raises(ValueError, match="broke its manifest.*w3: shape"):
        push_weights(learner, gen, 1)
    assert gen.needs_weights and gen.weight_version == 0 and gen.loaded == ["w0", "w1", "w2"]
    with pytest.raises(RuntimeError, match="refused"):
        gen.check_ready("generate")
