"""Writes the NumPy-made .npz fixtures of tests/npz_test.cc (run with any numpy >= 1.17)."""
import numpy as np

arrays = {
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
    "f64": np.array([1.5, -2.25], dtype=np.float64),
    "f16": np.array([0.5, -1.0, 65504.0], dtype=np.float16),
    "i64": np.array([[1, -2], [3, 1 << 40]], dtype=np.int64),
    "i32": np.array([7, -8, 9], dtype=np.int32),
    "b1": np.array([True, False, True]),
    "u1": np.array([0, 255], dtype=np.uint8),
    "scalar": np.float32(3.5),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "grad/w": np.ones((2, 2), dtype=np.float32),
}
np.savez("numpy_stored.npz", **arrays)
np.savez_compressed("numpy_deflated.npz", **arrays)
np.savez("numpy_fortran.npz", a=np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
         b=np.asfortranarray(np.arange(24, dtype=np.int64).reshape(2, 3, 4)))
np.savez("numpy_bigendian.npz", a=np.arange(3, dtype=">f4"))
np.savez("numpy_object.npz", a=np.array([{"k": 1}, None], dtype=object))
