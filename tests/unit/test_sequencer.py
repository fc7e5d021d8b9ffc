"""The subscriber's sequencer: a gap is held for the records that fill it, unless its source
said those records were evicted from its log (then the gap is lost at once, once per stream)."""

from __future__ import annotations

from roq.client.sequencer import Sequencer
from roq.log import format as fmt

PRODUCER = bytes(16)


def header(first_seq: int, count: int = 2, key: bytes = b"k") -> fmt.BatchHeader:
    stamps = [1_700_000_000_000_000] * count
    return fmt.read_header(fmt.encode_batch(PRODUCER, first_seq, key, [b"x"] * count, stamps))


def seqs(deliveries) -> list[int]:  # type: ignore[no-untyped-def]
    return [d.header.first_seq + d.skip for d in deliveries]


def test_a_gap_is_held_until_it_fills():
    sequencer, feed = Sequencer(gap_wait_s=60), object()
    assert seqs(sequencer.offer(header(0), b"", 0.0, feed)) == [0]
    assert sequencer.offer(header(4), b"", 0.0, feed) == []  # 2..3 missing: held
    assert seqs(sequencer.offer(header(2), b"", 0.0, feed)) == [2, 4]
    assert sequencer.lost == 0


def test_a_source_whose_log_evicted_is_forgiven_one_gap_per_stream():
    sequencer, feed, other = Sequencer(gap_wait_s=60), object(), object()
    for key in (b"a", b"b"):
        sequencer.offer(header(0, key=key), b"", 0.0, feed)
    sequencer.forgive(feed)
    assert sequencer.offer(header(10, key=b"a"), b"", 0.0, other) == []  # not that source
    assert seqs(sequencer.offer(header(20, key=b"b"), b"", 0.0, feed)) == [20]  # at once
    assert sequencer.lost == 18 and sequencer.gaps == 1
    assert sequencer.offer(header(30, key=b"b"), b"", 0.0, feed) == []  # once per stream
    assert seqs(sequencer.offer(header(12, key=b"a"), b"", 0.0, feed)) == [12]
    sequencer.forget(feed)
    assert sequencer.offer(header(40, key=b"a"), b"", 0.0, feed) == []  # held again


def test_a_corrupt_batch_is_skipped_and_counted_in_its_turn_without_waiting():
    sequencer, feed = Sequencer(gap_wait_s=60), object()
    assert seqs(sequencer.offer(header(0), b"", 0.0, feed)) == [0]
    assert sequencer.offer(header(4), b"", 0.0, feed) == []  # held: 2..3 missing
    assert seqs(sequencer.offer(header(2), b"", 0.0, feed, corrupt=True)) == [4]  # 2..3 skipped
    assert (sequencer.corrupt, sequencer.lost, sequencer.held) == (2, 0, 0)
    assert sequencer.offer(header(8), b"", 0.0, feed, corrupt=True) == []  # held in order
    assert seqs(sequencer.offer(header(6), b"", 0.0, feed)) == [6]  # then skipped after it
    assert sequencer.corrupt == 4 and sequencer.streams[(PRODUCER, b"k")].next_seq == 10
    sequencer.offer(header(9, count=3), b"", 0.0, feed, corrupt=True)  # overlaps a delivered one
    assert sequencer.corrupt == 6 and sequencer.duplicates == 1


def test_a_rereadable_source_is_refused_past_its_bound_and_never_makes_a_gap_skip():
    sequencer = Sequencer(gap_wait_s=60, held_max=4, held_per_source=2, from_start=True)
    ahead, behind = object(), object()
    for seq in (10, 12):  # 0..9 are in the other log: held
        assert not sequencer.refuses(header(seq), ahead)
        assert sequencer.offer(header(seq), b"", 0.0, ahead) == []
    assert sequencer.refuses(header(14), ahead)  # past this source's bound: read again later
    assert not sequencer.refuses(header(0, key=b"other"), ahead)  # deliverable: never refused
    assert not sequencer.refuses(header(0), behind) and sequencer.lost == 0
    before = sequencer.progress
    delivered = []
    for seq in range(0, 10, 2):
        delivered += seqs(sequencer.offer(header(seq), b"", 0.0, behind))
    assert delivered == [0, 2, 4, 6, 8, 10, 12] and sequencer.progress > before
    assert not sequencer.refuses(header(14), ahead) and sequencer.lost == 0


def test_the_total_bound_still_skips_the_gap_for_a_source_that_cannot_reread():
    sequencer = Sequencer(gap_wait_s=60, held_max=2)
    feed = object()
    assert seqs(sequencer.offer(header(0), b"", 0.0, feed)) == [0]
    assert sequencer.offer(header(4), b"", 0.0, feed) == []
    assert sequencer.offer(header(6), b"", 0.0, feed) == []
    assert seqs(sequencer.offer(header(8), b"", 0.0, feed)) == [4, 6, 8]  # over: 2..3 lost
    assert sequencer.lost == 2
