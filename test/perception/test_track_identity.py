"""UUIDs, existence probabilities and covariances of the published tracks."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError, MessageError
from dynshape_perception.perception.objects import (
    ObjectParams,
    TrackUuids,
    UuidIndex,
    existence_probability,
    pose_covariance,
    twist_covariance,
)


def test_track_uuids_are_stable_and_never_reused() -> None:
    uuids = TrackUuids(uuid.UUID(int=7))
    first = uuids.of(np.array([1, 2, 3]))
    assert first.shape == (3, 16) and first.dtype == np.uint8
    assert np.array_equal(uuids.of(np.array([3, 1])), first[[2, 0]])
    assert len({bytes(u) for u in first}) == 3
    uuids.reset()  # the tracker restarts its ids at 1
    assert not ({bytes(u) for u in uuids.of(np.array([1, 2, 3]))} & {bytes(u) for u in first})
    other_run = TrackUuids(uuid.UUID(int=8)).of(np.array([1]))
    assert bytes(other_run[0]) != bytes(first[0])


def test_a_track_uuid_is_the_name_of_its_generation_and_id() -> None:
    """Asked again, in any order, after other ids or none, an id gets the same UUID: the
    one its name gives (replays rely on it)."""
    namespace = uuid.UUID(int=7)
    uuids = TrackUuids(namespace)
    uuids.reset()
    asks = [[4, 9], [9], [], [4, 2, 9], [2, 4]]
    for ids in asks:
        got = uuids.of(np.array(ids, np.uint32))
        want = [uuid.uuid5(namespace, f"1/{i}").bytes for i in ids]
        assert got.shape == (len(ids), 16) and [bytes(u) for u in got] == want
        got[:] = 0  # the caller's copy


def test_uuid_index_gives_small_ids_and_forgets_gone_ones() -> None:
    index = UuidIndex()
    a, b, c = (np.full(16, v, np.uint8) for v in (1, 2, 3))
    assert index.update(np.stack([a, b])).tolist() == [1, 2]
    assert index.update(np.stack([b, c])).tolist() == [2, 3]
    assert np.array_equal(index.uuids(np.array([3, 2])), np.stack([c, b]))
    assert index.update(np.stack([a])).tolist() == [4]  # a was gone: a new id
    # A repeated UUID is another object: an id of its own, the same UUID back, counted.
    ids = index.update(np.stack([a, a, b, a]))
    assert ids[0] == 4 and len(set(ids.tolist())) == 4 and index.repeated == 2
    assert np.array_equal(index.uuids(ids), np.stack([a, a, b, a]))
    assert index.update(np.stack([a, a])).tolist() == ids[[0, 1]].tolist()
    assert index.repeated == 1


def test_uuid_rows_of_an_array_get_the_ids_of_the_same_uuids_given_one_by_one() -> None:
    rng = np.random.default_rng(5)
    pool = rng.integers(0, 256, (6, 16), dtype=np.uint8)
    rows, one_by_one = UuidIndex(), UuidIndex()
    for _ in range(50):
        message = pool[rng.integers(0, len(pool), int(rng.integers(0, 8)))]
        # A non-contiguous view, as a column of a wider table would be.
        wide = np.zeros((len(message), 32), np.uint8)
        wide[:, ::2] = message
        ids = rows.update(wide[:, ::2])
        assert ids.dtype == np.uint32 and ids.shape == (len(message),)
        # [N, 16, 1]: not the rows of a byte matrix, so read one by one.
        assert ids.tolist() == one_by_one.update(message[:, :, None]).tolist()
        assert rows.repeated == one_by_one.repeated
    with pytest.raises(MessageError, match="16 bytes"):
        UuidIndex().update(np.zeros((2, 15), np.uint8))


def test_existence_grows_with_hits_and_fades_with_misses() -> None:
    p = existence_probability(np.array([1, 3, 10, 10, 10]), np.array([0, 0, 0, 2, 5]), 5)
    assert p.dtype == np.float32 and ((p > 0) & (p < 1)).all()
    assert p[0] < p[1] < p[2] and p[2] > p[3] > p[4]


def test_covariance_grows_while_a_track_coasts() -> None:
    params = ObjectParams(position_std_m=0.5, velocity_std_mps=2.0)
    pose, twist = (
        pose_covariance(np.array([0, 1]), params),
        twist_covariance(np.array([0, 1]), params),
    )
    assert pose.shape == twist.shape == (2, 36)
    assert pose[0, 0] == pose[0, 7] == pytest.approx(0.25) and pose[1, 0] == pytest.approx(1.0)
    assert twist[0, 0] == pytest.approx(4.0) and twist[0, 35] == 0.0
    for cov in (pose, twist):
        assert np.allclose(cov.reshape(2, 6, 6), cov.reshape(2, 6, 6).transpose(0, 2, 1))


def test_bad_object_params() -> None:
    with pytest.raises(ConfigError, match="position_std_m"):
        ObjectParams(position_std_m=0.0)
