import json

import numpy as np

from app.releases.payloads import pack, unpack


def test_arrays_round_trip_exactly_through_json() -> None:
    rng = np.random.default_rng(0)
    value = {
        "codes": rng.integers(0, 2**40, size=1000).astype(np.int64),
        "bits": np.packbits(rng.random(1001) < 0.3),
        "matrix": rng.standard_normal((7, 3)),
        "nested": [{"x": np.float32(1.5), "y": np.arange(3, dtype=np.int32)}],
        "big": 2**64,
        "text": "ok",
        "alpha": float("inf"),
    }
    back = unpack(json.loads(json.dumps(pack(value), allow_nan=False)))
    np.testing.assert_array_equal(back["codes"], value["codes"])
    assert back["codes"].dtype == np.int64
    np.testing.assert_array_equal(back["bits"], value["bits"])
    assert back["matrix"].tobytes() == value["matrix"].tobytes()
    assert back["nested"][0]["x"] == 1.5
    assert back["nested"][0]["y"].dtype == np.int32
    assert (back["big"], back["text"], back["alpha"]) == (2**64, "ok", float("inf"))
