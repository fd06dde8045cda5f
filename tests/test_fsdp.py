"""FSDP2 on 2 gloo processes == one process: same losses, same updated weights, HF-loadable checkpoint."""
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from memr1.engine.generation.weights import ManifestStream, checkpoint_manifest
from memr1.engine.learner import Learner, LearnerConfig
from memr1.rl.losses import LossConfig

from test_learner import make_batch, tiny  # noqa: F401  (fixture reused)

STEPS = 2


def config(path):
    # token-mean: the denominator is the global token count, which the shards must agree on.
    return LearnerConfig(model_path=path, lr=2e-4, micro_batch_tokens=30,
                         loss=LossConfig(kl_coef=0.05, aggregation="token-mean"))


def _worker(rank, world, port, path, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist
    learner = Learner(config(path))
    try:
        odd = make_batch(n=7)
        learner.train_step(odd)
        raise AssertionError("an odd batch on 2 ranks must raise")
    except ValueError as e:
        assert "world size 2" in str(e)
    losses = [learner.train_step(make_batch(seed=s))["loss"] for s in range(STEPS)]
    # A generator streams the export against the manifest: full (global) shapes, known without gathering.
    assert any(p.to_local().shape != p.shape for p in learner.policy.lm.parameters())  # really sharded
    checked = ManifestStream((p for bucket in learner.export_weights(bucket_bytes=1 << 16) for p in bucket),
                             learner.weight_manifest(), checkpoint_manifest(path))
    exported = dict(checked)
    checked.raise_if_broken()
    assert list(learner.weight_manifest().items()) == [(k, tuple(v.shape)) for k, v in exported.items()]
    ckpt = learner.save_checkpoint(out, {"cursor": STEPS})
    learner.step = 0
    assert learner.load_checkpoint(ckpt) == {"cursor": STEPS} and learner.step == STEPS  # sharded load
    reloaded = {k: v for bucket in learner.export_weights() for k, v in bucket}
    assert all(torch.equal(reloaded[k], exported[k]) for k in exported)
    if rank == 0:
        torch.save({"losses": losses, "weights": exported, "ckpt": ckpt}, os.path.join(out, "result.pt"))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_match_single_process(tiny, tmp_path):  # noqa: F811
    from transformers import AutoModelForCausalLM
    mp.spawn(_worker, args=(2, free_port(), tiny, str(tmp_path)), nprocs=2, join=True)
    result = torch.load(tmp_path / "result.pt")

    single = Learner(config(tiny))
    losses = [single.train_step(make_batch(seed=s))["loss"] for s in range(STEPS)]
    assert result["losses"] == pytest.approx(losses, abs=1e-5)
    ref = {k: v for bucket in single.export_weights() for k, v in bucket}
    assert set(ref) == set(result["weights"])
    assert max((ref[k] - result["weights"][k]).abs().max().item() for k in ref) < 1e-5

    # The gathered checkpoint loads straight into transformers and equals the sharded run's weights.
    lm = AutoModelForCausalLM.from_pretrained(result["ckpt"])
    assert all(torch.allclose(p, ref[k], atol=1e-5) for k, p in lm.named_parameters())
    resumed = Learner(config(tiny))
    assert resumed.load_checkpoint(result["ckpt"]) == {"cursor": STEPS}  # written by 2 ranks, read by 1
    assert resumed.step == STEPS
