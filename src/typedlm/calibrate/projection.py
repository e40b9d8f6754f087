"""A read's features: its hidden state at the decision row (what the LM head read there), projected to at most
`FEATURE_DIMS` dimensions and kept in float16, so that a label stores them in 512 bytes.

    projection = Projection(fingerprint)
    features = projection(rows)            # [n, D] float32 → [n, min(D, 256)] float16
    text = encode(features[0]); decode(text)   # what a label stores, and back

The projection is a fixed Gaussian random matrix [D, dims] with entries N(0, 1/D), seeded by the model's fingerprint
and `FEATURES_VERSION`: every process serving the same weights projects alike, with no state to keep, and a
projected vector keeps the hidden state's scale (its root mean square). Distances and dot products are kept up to a
few percent at 256 dimensions (Johnson-Lindenstrauss), which is what a linear readout needs. A label's features are
bound, as its reading is, to the fingerprint and prompt version it was read with, and to `FEATURES_VERSION`: any
change to how features are made changes the version, and features of another version are not used.
"""

from __future__ import annotations

import base64
import hashlib
import threading

import numpy as np

FEATURE_DIMS = 256  # the most dimensions a read's features keep
FEATURES_VERSION = "gauss-1"  # how features are made: changed whenever the projection or the row read changes


class Projection:
    """The fixed random projection of one model's hidden states (see the module)."""

    def __init__(self, fingerprint: str, dims: int = FEATURE_DIMS):
        digest = hashlib.sha256(f"{FEATURES_VERSION}:{fingerprint}".encode()).digest()
        self.seed = int.from_bytes(digest[:8], "little")
        self.dims = dims
        self._matrices: dict[int, np.ndarray] = {}  # hidden size → its matrix (one model has one)
        self._lock = threading.Lock()

    def matrix(self, width: int) -> np.ndarray:
        """[width, min(width, dims)] float32, the same for the same fingerprint in every process."""
        with self._lock:
            found = self._matrices.get(width)
            if found is None:
                rng = np.random.default_rng(self.seed)
                dims = min(width, self.dims)
                found = rng.standard_normal((width, dims), dtype=np.float32) / np.float32(np.sqrt(width))
                self._matrices[width] = found
            return found

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        """Hidden states [n, D] → features [n, min(D, dims)] float16 (saturated at float16's range)."""
        projected = np.asarray(rows, dtype=np.float32) @ self.matrix(rows.shape[1])
        limit = np.finfo(np.float16).max
        return np.clip(projected, -limit, limit).astype(np.float16)


def encode(features: np.ndarray) -> str:
    """A feature vector as a label stores it: its float16 bytes (little-endian), in base64."""
    return base64.b64encode(np.asarray(features, dtype="<f2").tobytes()).decode("ascii")


def decode(text: str) -> np.ndarray:
    """`encode`'s vector back, as float32."""
    return np.frombuffer(base64.b64decode(text), dtype="<f2").astype(np.float32)
