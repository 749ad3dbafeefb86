"""workload.heap_faults: glibc's heap replayed over a step's storage events (no torch)."""

from __future__ import annotations

from lmperf.workload import heap_faults as hf

MiB = 2**20


def _step(*blocks: tuple[int, int, str]) -> list[hf.Event]:
    """Events of a step that allocates each (id, bytes, op) in order, then frees them in order
    during the 'optimizer' phase."""
    return [(sid, n, op) for sid, n, op in blocks] + [(sid, -1, "optimizer")
                                                       for sid, _, _ in blocks]


def test_the_mmap_threshold_follows_the_largest_freed_block_up_to_32_mib():
    assert hf.mmap_threshold(_step((0, 20 * MiB, "a"), (1, MiB, "b"))) == 20 * MiB + 4096
    assert hf.mmap_threshold(_step((0, 100 * MiB, "a"))) == hf.MMAP_THRESHOLD_MAX
    assert hf.mmap_threshold(_step((0, 1000, "a"))) == hf.MMAP_THRESHOLD_MIN
    never_freed = [(0, 20 * MiB, "a")]
    assert hf.mmap_threshold(never_freed) == hf.MMAP_THRESHOLD_MIN


def test_blocks_of_32_mib_or_more_fault_in_at_every_step():
    faults = hf.replay(_step((0, 40 * MiB, "big"), (1, 4 * MiB, "small")))
    assert faults.faulted == {"big": 40 * MiB}  # the small one is reused from the heap
    assert faults.returned == {"optimizer": 40 * MiB}  # unmapped where it is freed


def test_a_trimmed_heap_top_faults_in_again_at_the_next_step():
    # three 20 MiB blocks freed together leave 60 MiB at the top >= 2 T (T = 20 MiB + a page,
    # the largest block freed, as mapped): trimmed, faulted in again at each step
    step = _step((0, 20 * MiB, "logits"), (1, 20 * MiB, "log_softmax"), (2, 20 * MiB, "grad"))
    faults = hf.replay(step)
    assert faults.faulted == {"logits": 20 * MiB + 16, "log_softmax": 20 * MiB + 16,
                              "grad": 20 * MiB + 16}  # whole chunks, header included
    assert faults.returned == {"optimizer": 3 * (20 * MiB + 16)}  # the trim
    # two of them (40 MiB + 32 B < 2 T) never reach the trim threshold: resident
    assert hf.replay(_step((0, 20 * MiB, "logits"), (1, 20 * MiB, "x"))) == hf.Faults({}, {})


def test_a_long_lived_block_above_a_hole_keeps_it_resident():
    step = _step((0, 20 * MiB, "logits"), (1, 20 * MiB, "log_softmax"), (2, 20 * MiB, "grad"))
    # the first step leaves a block (AdamW's moments) above its own activations
    first = [(10, 20 * MiB, "a"), (11, 20 * MiB, "b"), (13, 20 * MiB, "c"), (12, MiB, "moments"),
             (10, -1, "backward"), (11, -1, "backward"), (13, -1, "backward")]
    assert hf.replay(step, first) == hf.Faults({}, {})
    # without the first step's survivor the same step is trimmed and faults
    assert hf.replay(step, first[:3] + first[4:]).faulted != {}


def test_a_free_block_is_reused_best_fit_and_the_remainder_stays_free():
    heap = hf._Heap(trim=10**12)
    assert heap.allocate(0, 100) == 100 and heap.allocate(1, 10) == 10
    assert heap.allocate(2, 50) == 50 and heap.allocate(3, 10) == 10
    heap.free(0)
    heap.free(2)
    assert heap.allocate(4, 40) == 0  # the 50-byte hole fits best: no growth
    assert [b[:2] for b in heap.blocks if b[2] is None] == [[0, 100], [150, 10]]
    heap.free(3)  # coalesced into a free top of 20 bytes at 150
    assert heap.allocate(5, 30) == 0  # the 100-byte hole below the top
    assert heap.allocate(6, 150) == 130 and heap.extent == 300  # no hole: the top grows


def test_a_request_above_the_threshold_takes_a_free_block_that_fits_before_mapping():
    # glibc 2.36 on the project's VM (malloc/memset through ctypes, ru_minflt): after a ~32 MiB
    # mapped block is freed (T ~ 32 MiB), three 20 MiB heap blocks, the first two freed: a
    # 36 MiB request faulted 0 MiB (the 40 MiB hole), a 33 MiB one next 33 MiB (mapped)
    first = [(0, 32 * MiB - 4 * 4096, "warm"), (0, -1, "forward")]
    step = [(1, 20 * MiB, "a"), (2, 20 * MiB, "b"), (3, 20 * MiB, "c"),
            (1, -1, "forward"), (2, -1, "forward"),
            (4, 36 * MiB, "hole"), (5, 33 * MiB, "big"),
            (3, -1, "backward"), (4, -1, "backward"), (5, -1, "backward")]
    faults = hf.replay(step, first)
    assert "hole" not in faults.faulted  # from the freed blocks, as glibc does
    assert faults.faulted["big"] == 33 * MiB  # nothing fits: mapped at every step
