"""The sync pipeline's parts without Ray: flat buckets keep the model's dtype and every byte, the fingerprint
sees a flipped bit where the bytes are, the pipeline runs the producer one bucket ahead and hands its errors to
the consumer, and the delivery check names the replica and the bucket that went wrong."""

from __future__ import annotations

import pickle
import threading
import time

import pytest
import torch

from engine.sync.flat import ALIGN, FlatBucket, fingerprint, flatten
from engine.sync.pipeline import ahead
from engine.sync.verify import Delivery, DeliveryCheck, SyncDeliveryError, weights_fingerprint


def bucket() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(33, 7, generator=g).to(torch.bfloat16), "b": torch.randn(5, generator=g),
            "ids": torch.arange(3), "s": torch.tensor(2.5, dtype=torch.float16)}


def test_a_flat_bucket_keeps_dtype_shape_and_bytes_at_aligned_offsets() -> None:
    src = bucket()
    fb = flatten(src, seq=4)
    assert fb.seq == 4 and fb.names == list(src)
    assert fb.nbytes == sum(t.numel() * t.element_size() for t in src.values())
    assert all(offset % ALIGN == 0 for _, _, _, offset, _ in fb.index) and fb.data.numel() % ALIGN == 0
    for name, t in fb.tensors():
        assert t.dtype == src[name].dtype and t.shape == src[name].shape and torch.equal(t, src[name]), name
    assert fb.data.dtype == torch.uint8 and dict(fb.index[i][:2] for i in range(4))["w"] == "bfloat16"


def test_pickled_buckets_travel_as_raw_bytes_and_the_receiver_recomputes_the_fingerprint() -> None:
    fb = flatten(bucket())
    back = pickle.loads(pickle.dumps(fb))
    assert back.fingerprint is None  # never trusted from the sender: computed where the bytes arrived
    assert fingerprint(back.data) == fb.fingerprint
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(fb.tensors(), back.tensors()))


def test_the_fingerprint_sees_any_flipped_bit_and_a_swap_of_two_words() -> None:
    fb = flatten(bucket())
    for byte in (0, 1, 77, fb.data.numel() - 1):
        for bit in (0, 7):
            data = fb.data.clone()
            data[byte] ^= 1 << bit
            assert fingerprint(data) != fb.fingerprint, (byte, bit)
    words = fb.data.clone().view(torch.int64)
    words[[0, 1]] = words[[1, 0]].clone()
    assert fingerprint(words.view(torch.uint8)) != fb.fingerprint


def test_ahead_produces_one_item_ahead_and_raises_the_producers_error_in_the_consumer() -> None:
    produced: list[int] = []

    def items():
        for i in range(4):
            produced.append(i)
            yield i

    it = ahead(items(), depth=1)
    assert next(it) == 0
    time.sleep(0.2)
    assert produced == [0, 1, 2]  # item 1 waits in the queue, item 2 is made and waits for room
    assert list(it) == [1, 2, 3]

    def failing():
        yield 1
        raise ValueError("gather failed")

    with pytest.raises(ValueError, match="gather failed"):
        list(ahead(failing()))
    it = ahead(iter(range(100)))
    next(it)
    it.close()  # an early stop ends the producer thread
    assert not [t for t in threading.enumerate() if t.name == "asyncrl-sync-ahead"]


def test_delivery_records_the_receivers_checksums() -> None:
    sent = [flatten(bucket(), seq=k) for k in range(3)]
    received = [pickle.loads(pickle.dumps(fb)) for fb in sent]
    received[1].data = received[1].data.clone()
    received[1].data[5] ^= 0x10
    d = Delivery(received)
    assert [isinstance(fb, FlatBucket) for fb in d] == [True] * 3
    assert d.fingerprints[0] == sent[0].fingerprint and d.fingerprints[1] != sent[1].fingerprint


def test_the_delivery_check_names_the_replica_and_the_bucket() -> None:
    sent, names = [11, 22, 33], [["a"], ["b.weight", "c.weight"], ["d"]]
    check = DeliveryCheck()
    report = check.check(1, sent, {0: {"fingerprints": sent}, 1: {"fingerprints": sent}}, names)
    assert report.alarms == [] and report.replicas == 2 and report.verified == 1.0
    assert check.check(1, sent, {}, names).verified == 0.0  # nothing reported: nothing verified
    with pytest.raises(SyncDeliveryError, match=r"replica 1 loaded bucket 1 \(b.weight, c.weight\)"):
        check.check(2, sent, {0: {"fingerprints": sent}, 1: {"fingerprints": [11, 99, 33]}}, names)
    with pytest.raises(SyncDeliveryError, match="replica 0 did not load bucket 2"):
        check.check(2, sent, {0: {"fingerprints": [11, 22]}}, names)
    with pytest.raises(SyncDeliveryError, match="replica 3 did not load the weights"):
        check.check(2, sent, {3: None}, names)


def test_the_alarm_fires_when_a_replica_s_weights_did_not_change_but_the_sent_ones_did() -> None:
    check = DeliveryCheck()
    assert check.check(1, [1, 2], {0: {"fingerprints": [1, 2], "weights": 5}, 1: {"fingerprints": [1, 2],
                                                                                  "weights": 6}}).alarms == []
    report = check.check(2, [3, 4], {0: {"fingerprints": [3, 4], "weights": 5}, 1: {"fingerprints": [3, 4],
                                                                                    "weights": 7}})
    assert len(report.alarms) == 1 and "replica 0's weights did not change" in report.alarms[0]
    assert report.verified == 0.5  # one of two replicas' loads took effect
    # the same weights sent again (no update): unchanged replicas are expected, no alarm
    assert check.check(3, [3, 4], {0: {"fingerprints": [3, 4], "weights": 5}}).verified == 1.0


def test_every_worker_of_a_multi_process_replica_is_checked_by_its_own_receipt() -> None:
    """A vLLM replica of two workers (on two nodes): each worker's fingerprints of the bytes it received are compared
    with what was sent, a worker that reported nothing fails the sync, and a worker whose weight sample did not change
    raises the alarm naming it."""
    sent, check = [11, 22], DeliveryCheck()
    ok = {"fingerprints": sent, "weights": 1, "workers": [sent, sent], "world": 2, "worker_weights": [5, 6]}
    report = check.check(1, sent, {0: ok})
    assert report.verified == 1.0 and report.workers == 2
    with pytest.raises(SyncDeliveryError, match=r"replica 0 worker 1 loaded bucket 1 with checksum"):
        check.check(2, sent, {0: {**ok, "workers": [sent, [11, 99]]}})
    with pytest.raises(SyncDeliveryError, match="replica 0: 1 of its 2 workers reported a receipt"):
        check.check(2, sent, {0: {**ok, "workers": [sent]}})
    report = check.check(3, [33, 44], {0: {**ok, "fingerprints": [33, 44], "workers": [[33, 44]] * 2, "weights": 2,
                                           "worker_weights": [7, 6]}})
    assert report.alarms == ["weight sync v3: rollout replica 0's weights (worker 1) did not change although the "
                             "trainer sent changed weights: its load had no effect"]
    assert report.verified == 0.0 and report.workers == 2


def test_weights_fingerprint_changes_when_a_trained_tensor_changes(tiny_lm) -> None:
    model = tiny_lm(seed=1)
    before = weights_fingerprint(model.state_dict().values())
    assert weights_fingerprint(model.state_dict().values()) == before
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.001)
    assert weights_fingerprint(model.state_dict().values()) != before


def test_a_buffer_ring_reuses_resident_buffers_in_turn_and_grows_a_slot_when_needed() -> None:
    from engine.sync.flat import BufferRing

    ring = BufferRing(3)
    a, b, c = (ring.get(4096, "cpu") for _ in range(3))
    assert len({a.data_ptr(), b.data_ptr(), c.data_ptr()}) == 3
    assert ring.get(64, "cpu").data_ptr() == a.data_ptr()  # slot 0 again, no new allocation
    assert ring.get(8192, "cpu").numel() == 8192  # slot 1 grows
    fb = flatten(bucket(), ring=ring)
    assert fb.data.data_ptr() == c.data_ptr() and fb.fingerprint == flatten(bucket()).fingerprint


def test_weights_fingerprint_is_the_sample_of_every_tensor_whatever_its_layout() -> None:
    """The sample (every 4099th byte of each tensor, summed, chained) is the same whether a tensor is read
    through numpy (contiguous, on the host) or through torch (here: a transposed view)."""
    import torch

    from engine.sync.verify import SAMPLE_STRIDE

    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(300, 70, generator=g).to(torch.bfloat16), torch.randn(9000, generator=g),
               torch.randn(50, 90, generator=g).t(), torch.zeros(0)]
    h = 0
    for t in tensors:
        b = t.contiguous().view(-1).view(torch.uint8)
        h = (h * 1000003 + int(b[::SAMPLE_STRIDE].to(torch.int64).sum()) + b.numel()) % 2**64
    assert weights_fingerprint(tensors) == h
