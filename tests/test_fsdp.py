"""FSDP2 on 2 gloo processes, each training its own groups == one process training all of them: same
losses, same updated weights, HF-loadable checkpoint. The ranks hold different numbers of groups, so
the step's denominators and micro-batch count must come from the scalar all-reduces."""
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from memr1.engine.checkpoints import io as checkpoint
from memr1.engine.generation.weights import ManifestStream, checkpoint_manifest
from memr1.engine.training.config import LearnerConfig, LoraConfig
from memr1.engine.training.learner import Learner
from memr1.rl.algos.config import LossConfig
from memr1.rl.records import TrainBatch

from learner_helpers import make_batch

STEPS = 2
SHARES = ([0, 1, 2], [3])   # rank -> its groups of each step's batch


def learner(path, lora=0):
    # token-mean: the denominator is the global token count, which the ranks must agree on. `lora`: the
    # adapters' rank (0: every weight trains), sharded alongside the frozen base weights.
    return Learner(LearnerConfig(micro_batch_tokens=30, loss=LossConfig(kl_coef=0.05, aggregation="token-mean"),
                                 lora=LoraConfig(rank=lora, alpha=8.0)), path, lr=2e-4 if not lora else 2e-2)


def share(batch, rank):
    return TrainBatch([batch.groups[i] for i in SHARES[rank]], batch.weight_version)


def _worker(rank, world, port, path, out, lora):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist
    lrn = learner(path, lora)
    losses = [lrn.train_step(share(make_batch(seed=s), rank))["loss"] for s in range(STEPS)]
    # A generator streams the export against the manifest: full (global) shapes, known without gathering.
    assert any(p.to_local().shape != p.shape for p in lrn.policy.lm.parameters())  # really sharded
    checked = ManifestStream(lrn.export_weights(), lrn.weight_manifest(), checkpoint_manifest(path))
    exported = dict(checked)
    checked.raise_if_broken()
    assert list(lrn.weight_manifest().items()) == [(k, tuple(v.shape)) for k, v in exported.items()]
    ckpt = checkpoint.save(lrn, out, STEPS, {"cursor": STEPS})
    lrn.step = 0
    assert checkpoint.load(lrn, ckpt)["data"] == {"cursor": STEPS} and lrn.step == STEPS  # sharded load
    reloaded = dict(lrn.export_weights())
    assert all(torch.equal(reloaded[k], exported[k]) for k in exported)
    if rank == 0:
        torch.save({"losses": losses, "weights": exported, "ckpt": ckpt}, os.path.join(out, "result.pt"))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_two_gloo_ranks_match_single_process(tiny, tmp_path, lora):  # noqa: F811
    from transformers import AutoModelForCausalLM
    mp.spawn(_worker, args=(2, free_port(), tiny, str(tmp_path), lora), nprocs=2, join=True)
    result = torch.load(tmp_path / "result.pt")

    single = learner(tiny, lora)
    losses = [single.train_step(make_batch(seed=s))["loss"] for s in range(STEPS)]
    assert result["losses"] == pytest.approx(losses, abs=1e-5)
    ref = dict(single.export_weights())
    assert set(ref) == set(result["weights"])
    assert max((ref[k] - result["weights"][k]).abs().max().item() for k in ref) < 1e-5

    # The gathered checkpoint loads straight into transformers and equals the sharded run's weights.
    lm = AutoModelForCausalLM.from_pretrained(result["ckpt"])
    assert all(torch.allclose(p, ref[k], atol=1e-5) for k, p in lm.named_parameters())
    resumed = learner(tiny, lora)
    assert checkpoint.load(resumed, result["ckpt"])["data"] == {"cursor": STEPS}  # written by 2 ranks, read by 1
    assert resumed.step == STEPS
