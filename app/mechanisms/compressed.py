"""Compressed release ``Phi X``: paper 002 (Zhou, Ligett, Wasserman), *not* differential privacy.

Mechanism
---------
1. Column normalisation, eq. (4): every column of the ``n x p`` data is rescaled to
   squared norm ``n``, so ``Sigma = X^T X / n`` has unit diagonal. The scale factors are
   not released.
2. ``Phi`` is ``m x n`` with iid ``N(0, 1/n)`` entries; the release is the ``m x p``
   matrix ``Phi X`` (``m < n`` rows, the ``p`` original variables).
3. Truncation, Procedure 4.1: ``Phi`` is redrawn until eq. (12) holds,
   ``max_{jk} |(Phi X)^T (Phi X) / m - Sigma_1|_{jk} <= C sqrt(ln(2np) / m) + Delta_max``,
   with ``C = sqrt(2 (C1 + C2))``, ``C1 = 4e/sqrt(6 pi) ~ 2.5044``, ``C2 = sqrt(8) e ~ 7.6885``
   (Lemma B.1; the paper prints ``C2 = sqrt(8e)`` but its value 7.6885 is ``sqrt(8) e``).
   The redraws and their number are never revealed (the paper: "the adversary neither
   sees the databases we throw away nor finds out that we did so"), except through time:
   each redraw reads the rows again, so a redraw lengthens the measure stage, whose start
   and end a release's status shows (``measured_at``). Under Lemma 4.4 a redraw happens
   with probability at most ``1/n^2`` (the size of the additive term the guarantee
   carries with a data reference), so the service does not pad the stage to a fixed
   number of passes (which would multiply its cost, up to :data:`MAX_DRAWS` passes).
   ``m >= 2 (C1 + C2) ln(2np)`` is enforced: Lemma 4.4 then bounds the truncated mass by
   ``1/n^2``.

Guarantee: distributional privacy (Definition 2.4), not differential privacy
----------------------------------------------------------------------------
The guarantee holds over a class ``S_n`` of databases whose normalised covariances lie
within ``Delta_max`` (entrywise, eq. 6) of a reference ``Sigma_1``; ``Delta_max`` is
declared by the curator. For ``X_i`` in ``S_n`` the output densities satisfy
``f_{X_1} <= e^alpha f_{X_i}`` with ``alpha`` bounded by Theorem 4.6, eq. (15):

    alpha <= m p ||Delta||_F / (2 l_i l_1) * ( C sqrt(ln(2np)/m) + Delta_max
             + 2 ||Delta||_F ||Sigma_1||_2^2 / (p l_i l_1) ) + o(1),

``l_1 = lambda_min(Sigma_1)``, ``l_i = lambda_min(Sigma_i)``. :func:`alpha_bound`
evaluates it at the worst case over ``S_n``: ``||Delta||_F = p Delta_max`` (eq. 7) and
``l_i >= l_1 - p Delta_max`` (Lemma 3.3), and replaces the ``o(1)`` by the
renormalisation term of Remark 4.3, ``-ln(1 - 1/n^2)``. The proof of eq. (15) (appendix C)
bounds ``A`` of Lemma C.2 through ``1/(1 - ||Sigma_1||_2 ||Gamma||_2)^2``; the printed
factor 2 in the last term covers that when ``||Sigma_1||_2 ||Gamma||_F <= 1/2`` with
``||Gamma||_F <= ||Delta||_F / (l_i l_1)`` (eq. 8), so the bound is reported as infinite
outside that range (and when ``l_1 <= p Delta_max``). Any two databases of ``S_n`` are
within ``2 alpha`` (Remark 4.7: :attr:`CompressedRelease.alpha_pairwise`).

The reference ``Sigma_1``. The truncation region must be the same for every database of
``S_n``, so ``Sigma_1`` should be public: pass ``reference`` (a declared ``p x p``
matrix); the data must then lie in ``S_n`` (``max |Sigma - Sigma_1| <= Delta_max``) or the
release is refused (a data-dependent refusal: Definition 2.4 promises nothing outside
``S_n``), and ``alpha`` depends on public quantities only. The refusal is one bit about
the data; the service allows one compressed release per dataset
(:attr:`app.releases.adapters.compressed.Compressed.single_release`), since retries with
moving references bisect an entry of the data's ``Sigma`` and independent repeats of
``Phi X`` average towards it. Without
``reference`` the data's own ``Sigma`` is used (``reference_kind = "data"``): the
truncation region then moves with the data, which the paper's proof does not cover (an
output that a neighbour's region excludes has probability at most ``1/n^2`` by Lemma 4.4,
an additive failure probability), so such a release claims no guarantee
(:data:`DATA_REFERENCE_GUARANTEE`); and ``alpha`` would be computed from two eigenvalues of
the data's ``Sigma``, so ``alpha`` itself is a statistic of the data: it is not computed
(``alpha = None``), so it is neither stored with the measurement nor reported
(:mod:`app.releases.adapters.compressed`).

Zero columns. Eq. (4) cannot normalise a column that is zero in every row (a column
constant at the midpoint of its declared bounds: the service stores values mapped to
``[-1, 1]``). Such a column is released as it is, zero, whatever ``Phi`` is: its scale is
0 and its row and column of ``Sigma`` (diagonal included) are 0. The output then shows
the column is zero, which any ``Phi X`` of it would. With the data as reference the
release goes ahead (``Sigma`` is singular; ``alpha`` is not computed in that case
anyway); with a declared reference such data lie in ``S_n`` only if the reference's
diagonal entry for the column is at most ``Delta_max`` (and its row within ``Delta_max``
of 0), otherwise the release is refused.
(Until this was handled the release failed after reading the data, and the dataset's one
compressed release was spent on an error.)

``Phi`` is drawn from OpenDP's CSPRNG (:func:`app.mechanisms.secure_random.standard_normal`):
not for a DP proof, but so that it cannot be reproduced from a seed.

PCA (Theorem 5.1, Proposition 3.4)
----------------------------------
:meth:`CompressedRelease.pca` eigen-decomposes ``A + B = (Phi X)^T (Phi X) / m``, an
estimate of ``A = X^T X / n`` (uncentred, of the column-normalised data, as in the paper).
Because eq. (12) holds, ``|B_{jk}| <= tau = C sqrt(ln(2np)/m) + 2 Delta_max``
(``+ Delta_max`` with the data as reference) and ``||B||_F <= p tau`` (proof of Theorem 5.1).
With Weyl's inequality the unknown eigengap of ``A`` is at least the released one minus
``p tau``, and Proposition 3.4 (Zwald and Blanchard) gives
``||P^D(A) - P^D(A + B)||_F <= p tau / delta_hat`` with
``delta_hat = (lambda_D - lambda_{D+1})(A + B)/2 - p tau``, valid when
``p tau <= delta_hat / 2``; otherwise the bound is reported as not applicable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms import secure_random
from app.mechanisms.data import RowSource, as_source, iter_checked
from app.mechanisms.errors import MechanismError, SolverError
from app.mechanisms.privacy import PrivacyCost

#: Constants of Lemma B.1 (paper 002).
C1 = 4.0 * math.e / math.sqrt(6.0 * math.pi)
C2 = math.sqrt(8.0) * math.e
#: ``C`` of eq. (12).
C = math.sqrt(2.0 * (C1 + C2))

GUARANTEE = "distributional privacy (paper 002), not differential privacy"
#: The guarantee of a release with the data as its own reference: Theorem 4.6 is proved
#: for a truncation region fixed in advance (a public ``Sigma_1``), so none is claimed.
DATA_REFERENCE_GUARANTEE = (
    "no proven privacy guarantee: paper 002's distributional privacy (Theorem 4.6) needs a "
    "declared reference covariance (params.reference), and with the data's own the "
    "truncation region moves with the data; not differential privacy"
)

#: Redraws of ``Phi`` before giving up. Under Lemma 4.4 each draw is truncated with
#: probability <= 1/n^2, so reaching this limit has probability <= n^(-2 * MAX_DRAWS).
MAX_DRAWS = 20

#: Entries of ``Phi`` drawn per block (bounds working memory to ~32 MB).
_BLOCK_ENTRIES = 1 << 22
#: Largest ``m n`` (entries of one ``Phi``) a release may draw. Each entry is a normal from
#: OpenDP's CSPRNG: 36-65 ns here (2 cores; ``n = 10^5``, ``m = 500, 2000``), so a draw at
#: this bound takes 3-5.5 minutes (a second draw has probability ``<= 1/n^2``). It admits
#: the smallest ``m`` (:func:`min_rows`: 390 at ``n = 10^7``, ``p = 10``) up to ``10^7``
#: rows; without it ``m = 999 999`` on ``10^6`` rows was accepted, some 10 hours a draw.
MAX_PROJECTION_ENTRIES = 5 * 10**9

ReferenceKind = Literal["declared", "data"]


def guarantee_of(reference_kind: ReferenceKind) -> str:
    """What a release with this reference may claim: :data:`GUARANTEE` for a declared
    reference, :data:`DATA_REFERENCE_GUARANTEE` (no proven guarantee) for the data's own."""
    return GUARANTEE if reference_kind == "declared" else DATA_REFERENCE_GUARANTEE


def min_rows(n: int, p: int) -> int:
    """Smallest ``m`` allowed by Lemma 4.4: ``ceil(2 (C1 + C2) ln(2 n p))``."""
    return math.ceil(2.0 * (C1 + C2) * math.log(2.0 * n * p))


def check_projection_size(n: int, p: int, m: int) -> None:
    """Refuse an ``m`` whose ``Phi`` (``m x n``) has more than :data:`MAX_PROJECTION_ENTRIES`
    entries, naming the largest ``m`` for this ``n`` (public values only: a caller checks
    it before reading any data)."""
    if m * n <= MAX_PROJECTION_ENTRIES:
        return
    largest = MAX_PROJECTION_ENTRIES // n
    if largest < min_rows(n, p):
        raise MechanismError(
            f"a compressed release of {n} rows would draw at least {min_rows(n, p)} x {n} "
            f"normals, more than the {MAX_PROJECTION_ENTRIES:,} this service draws for one"
        )
    raise MechanismError(
        f"m ({m}) times n ({n}) is over the {MAX_PROJECTION_ENTRIES:,} entries of Phi one "
        f"release may draw (minutes of work): m may be at most {largest} here"
    )


def truncation_radius(n: int, p: int, m: int, delta_max: float) -> float:
    """Right-hand side of eq. (12): ``C sqrt(ln(2np) / m) + Delta_max``."""
    return C * math.sqrt(math.log(2.0 * n * p) / m) + delta_max


def satisfies_eq12(
    compressed_cov: NDArray[np.float64], reference: NDArray[np.float64], radius: float
) -> bool:
    """Eq. (12): ``max_{jk} |(X^T X / m)_{jk} - Sigma_1(j, k)| <= radius``."""
    return bool(np.max(np.abs(compressed_cov - reference)) <= radius)


def alpha_bound(
    n: int,
    p: int,
    m: int,
    delta_max: float,
    lambda_min_reference: float,
    norm_reference: float,
) -> float:
    """Theorem 4.6 (eq. 15) at the worst case over ``S_n``; ``inf`` where it does not apply.

    ``lambda_min_reference`` and ``norm_reference`` are ``lambda_min(Sigma_1)`` and
    ``||Sigma_1||_2``. See the module docstring for the worst case and the validity range.
    """
    delta_f = p * delta_max  # ||Delta||_F <= p Delta_max, eq. (7)
    l1 = lambda_min_reference
    li = l1 - delta_f  # Lemma 3.3 with ||Delta||_2 <= ||Delta||_F
    if l1 <= 0.0 or li <= 0.0:
        return math.inf
    gamma_f = delta_f / (li * l1)  # eq. (8)
    if norm_reference * gamma_f > 0.5:
        return math.inf
    bracket = (
        C * math.sqrt(math.log(2.0 * n * p) / m)
        + delta_max
        + 2.0 * delta_f * norm_reference**2 / (p * li * l1)
    )
    renormalisation = -math.log1p(-1.0 / n**2)  # Remark 4.3, truncated mass <= 1/n^2
    return m * p * delta_f / (2.0 * li * l1) * bracket + renormalisation


@dataclass(frozen=True, eq=False)
class PCAResult:
    """Top-``k`` principal directions of the compressed covariance ``(Phi X)^T (Phi X) / m``.

    ``components`` is ``(k, p)`` (rows are unit eigenvectors, largest eigenvalue
    first), ``explained_variance`` the eigenvalues, ``explained_variance_ratio`` their
    share of the trace. ``projector_error_bound`` bounds ``||P^k(A) - P^k(A + B)||_F``
    (Proposition 3.4), ``None`` where the bound does not apply.
    """

    components: NDArray[np.float64]
    explained_variance: NDArray[np.float64]
    explained_variance_ratio: NDArray[np.float64]
    projector_error_bound: float | None

    def __post_init__(self) -> None:
        if self.components.ndim != 2 or self.components.shape[0] != self.explained_variance.size:
            raise MechanismError("components must be (k, p) with k explained variances")

    @property
    def projector(self) -> NDArray[np.float64]:
        """``P^k = V_k^T V_k``, the orthogonal projector onto the top-``k`` subspace."""
        projector: NDArray[np.float64] = self.components.T @ self.components
        return projector


@dataclass(frozen=True, eq=False)
class CompressedRelease:
    """The compressed matrix ``Phi X`` with its distributional-privacy bound.

    ``guarantee`` follows from ``reference_kind`` (:func:`guarantee_of`): paper 002's
    distributional privacy for a declared reference, no proven guarantee for the data's own.
    ``privacy_cost`` has ``kind="distributional"`` and epsilon 0 so that it can never be
    added to an epsilon sum; the guarantee is ``alpha`` (Theorem 4.6, comparing with the
    reference) and ``alpha_pairwise = 2 alpha`` (Remark 4.7, any two databases of
    ``S_n``); both ``None`` with the data as reference, where they would be statistics of
    the data. ``n`` is public; the column scales and the redraw count are not kept.
    """

    matrix: NDArray[np.float64]
    n: int
    delta_max: float
    alpha: float | None
    reference_kind: ReferenceKind
    guarantee: str = field(init=False)
    privacy_cost: PrivacyCost = field(init=False)

    def __post_init__(self) -> None:
        matrix = np.array(self.matrix, dtype=np.float64)  # a private, read-only copy
        if matrix.ndim != 2 or matrix.shape[0] < 1 or matrix.shape[1] < 1:
            raise MechanismError("matrix must be a non-empty (m, p) array")
        if not np.all(np.isfinite(matrix)):
            raise MechanismError("matrix must be finite")
        _check_delta_max(self.delta_max)
        if not (isinstance(self.n, int | np.integer) and self.n > matrix.shape[0]):
            raise MechanismError("n must be an integer larger than m (the rows of matrix)")
        if self.reference_kind not in ("declared", "data"):
            raise MechanismError("reference_kind must be 'declared' or 'data'")
        if self.reference_kind == "data":
            if self.alpha is not None:
                raise MechanismError("alpha must be None with the data as reference")
        elif self.alpha is None or not (self.alpha >= 0.0):
            raise MechanismError("alpha must be >= 0 (inf when the bound does not apply)")
        object.__setattr__(self, "guarantee", guarantee_of(self.reference_kind))
        matrix.setflags(write=False)
        object.__setattr__(self, "matrix", matrix)
        object.__setattr__(self, "n", int(self.n))
        cost = PrivacyCost(epsilon=0.0, delta=0.0, kind="distributional")
        object.__setattr__(self, "privacy_cost", cost)

    @property
    def m(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def p(self) -> int:
        return int(self.matrix.shape[1])

    @property
    def alpha_pairwise(self) -> float | None:
        """Bound for any two databases of ``S_n``: ``2 alpha`` (Remark 4.7)."""
        return None if self.alpha is None else 2.0 * self.alpha

    @property
    def covariance(self) -> NDArray[np.float64]:
        """``A + B = (Phi X)^T (Phi X) / m``, the compressed estimate of ``X^T X / n``."""
        cov: NDArray[np.float64] = self.matrix.T @ self.matrix / self.m
        return cov

    @property
    def entry_error(self) -> float:
        """``tau``: the bound on ``max_{jk} |B_{jk}|`` implied by eq. (12) (Theorem 5.1)."""
        slack = 2.0 if self.reference_kind == "declared" else 1.0
        return truncation_radius(self.n, self.p, self.m, 0.0) + slack * self.delta_max

    def pca(self, k: int) -> PCAResult:
        """Top-``k`` components of the compressed covariance with the bound of Proposition 3.4."""
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= self.p:
            raise MechanismError(f"k ({k}) must be an integer in [1, p = {self.p}]")
        values, vectors = np.linalg.eigh(self.covariance)
        order = np.argsort(values)[::-1]
        values = np.clip(values[order], 0.0, None)
        vectors = vectors[:, order]
        trace = float(values.sum())
        bound: float | None
        if k == self.p:
            bound = 0.0  # both projectors are the identity
        else:
            b_norm = self.p * self.entry_error  # ||B||_F <= p tau
            gap = 0.5 * float(values[k - 1] - values[k]) - b_norm
            bound = b_norm / gap if gap > 0.0 and b_norm <= gap / 2.0 else None
        return PCAResult(
            components=vectors[:, :k].T.copy(),
            explained_variance=values[:k].copy(),
            explained_variance_ratio=values[:k] / trace if trace > 0 else np.zeros(k),
            projector_error_bound=bound,
        )

    def to_dict(self) -> dict[str, object]:
        """Scalars for JSON plus the ``(m, p)`` array ``matrix``."""
        return {
            "mechanism": "compressed",
            "guarantee": self.guarantee,
            "n": self.n,
            "delta_max": self.delta_max,
            "alpha": self.alpha,
            "alpha_pairwise": self.alpha_pairwise,
            "reference_kind": self.reference_kind,
            "matrix": self.matrix,
            "privacy_cost": self.privacy_cost.as_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CompressedRelease:
        """A stored record; one with the data as reference recorded before ``alpha`` was
        left out of it loads without it (it was never reported). The stored ``guarantee``
        is not read: it follows from ``reference_kind`` (records with the data as
        reference stored :data:`GUARANTEE` before :data:`DATA_REFERENCE_GUARANTEE`)."""
        kind = str(data["reference_kind"])
        return cls(
            matrix=np.asarray(data["matrix"], dtype=np.float64),
            n=int(data["n"]),  # type: ignore[call-overload]
            delta_max=float(data["delta_max"]),  # type: ignore[arg-type]
            alpha=None if kind == "data" else float(data["alpha"]),  # type: ignore[arg-type]
            reference_kind=kind,  # type: ignore[arg-type]
        )


def _check_delta_max(delta_max: float) -> float:
    if not (isinstance(delta_max, int | float) and 0.0 < delta_max < 1.0):
        raise MechanismError(f"delta_max ({delta_max!r}) must lie in (0, 1) (Theorem 3.2)")
    return float(delta_max)


def _normalised_covariance(source: RowSource) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``Sigma = X^T X / n`` after the normalisation of eq. (4), and the column scales.

    A column that is zero in every row (constant at the midpoint of its declared bounds)
    has no norm to normalise: its scale is 0, so its column of ``Phi X`` is 0, as
    ``Phi`` times that column is whatever the scale, and its row and column of ``Sigma``
    are 0, its diagonal included (see the module docstring, "Zero columns")."""
    gram = np.zeros((source.n_cols, source.n_cols))
    for batch in iter_checked(source):
        gram += batch.T @ batch
    norms2 = np.diag(gram).copy()
    zero = norms2 <= 0.0
    scale = np.where(zero, 0.0, np.sqrt(source.n_rows / np.where(zero, 1.0, norms2)))
    sigma = gram * np.outer(scale, scale) / source.n_rows
    np.fill_diagonal(sigma, np.where(zero, 0.0, 1.0))
    return sigma, scale


def _project(
    source: RowSource,
    scale: NDArray[np.float64],
    m: int,
    progress: Callable[[float], None] | None = None,
) -> NDArray[np.float64]:
    """``Phi X`` for a fresh ``Phi`` (iid ``N(0, 1/n)``), generated block by block;
    ``progress`` is called after each block with the rows projected over ``n``."""
    n = source.n_rows
    out = np.zeros((m, source.n_cols))
    block = max(1, _BLOCK_ENTRIES // m)
    projected = 0
    for batch in iter_checked(source):
        scaled = batch * scale
        for start in range(0, scaled.shape[0], block):
            rows = scaled[start : start + block]
            phi = secure_random.standard_normal((m, rows.shape[0]))
            out += phi @ rows
            projected += rows.shape[0]
            if progress is not None:
                progress(min(1.0, projected / max(n, 1)))
    out /= math.sqrt(n)
    return out


def _draw_progress(
    progress: Callable[[float], None] | None, redraws: int
) -> Callable[[float], None] | None:
    """The ``progress`` of draw number ``redraws`` (0: the first): the first draw's
    fraction, then 1.0 (a redraw still calls it after each block)."""
    if progress is None:
        return None
    return lambda done: progress(min(1.0, redraws + done))


def _draw(
    source: RowSource,
    scale: NDArray[np.float64],
    m: int,
    reference: NDArray[np.float64],
    radius: float,
    progress: Callable[[float], None] | None = None,
) -> tuple[NDArray[np.float64], int]:
    """Procedure 4.1: redraw ``Phi`` until eq. (12) holds. Returns ``Phi X`` and the redraws.

    ``progress`` follows the first draw's blocks; a redraw (probability ``<= 1/n^2``)
    calls it with 1.0 after each of its blocks, so it never goes back and stays a point
    where a caller can stop. The redraw count is for tests only; :func:`release`
    discards it.
    """
    for redraws in range(MAX_DRAWS):
        matrix = _project(source, scale, m, _draw_progress(progress, redraws))
        if satisfies_eq12(matrix.T @ matrix / m, reference, radius):
            return matrix, redraws
    raise SolverError(
        f"eq. (12) failed for {MAX_DRAWS} independent draws of Phi, which Lemma 4.4 makes "
        "practically impossible when its conditions hold"
    )


def check_reference(reference: ArrayLike, p: int, delta_max: float) -> NDArray[np.float64]:
    """``reference`` as a ``p x p`` float array, or a :class:`MechanismError` if it cannot be
    a declared ``Sigma_1``: finite, symmetric and positive definite (Assumption 1), with
    every diagonal entry within ``delta_max`` of 1 or of 0.

    The data's normalised covariance has a diagonal of 1 (eq. 4: each column scaled to
    norm ``sqrt(n)``) or 0 (a column zero in every row), so a reference entry with
    ``|Sigma_1(j, j) - 1| > Delta_max`` and ``Sigma_1(j, j) > Delta_max`` puts every
    database outside ``S_n`` (eq. 6): such a release would be refused after reading the
    data, spending the dataset's one compressed release on what the request alone decides.
    It depends on the request only, so a caller can run it before reading any data
    (:func:`release` does).
    """
    ref = np.asarray(reference, dtype=np.float64)
    if ref.shape != (p, p):
        raise MechanismError(f"reference must be a ({p}, {p}) matrix; got {ref.shape}")
    if not np.all(np.isfinite(ref)) or not np.allclose(ref, ref.T, rtol=0.0, atol=1e-12):
        raise MechanismError("reference must be a finite symmetric matrix")
    if np.linalg.eigvalsh(ref)[0] <= 0.0:
        raise MechanismError("reference must be positive definite (Assumption 1)")
    diagonal = np.diag(ref)
    far = np.flatnonzero((np.abs(diagonal - 1.0) > delta_max) & (np.abs(diagonal) > delta_max))
    if far.size:
        raise MechanismError(
            f"reference's diagonal entry {int(far[0])} is more than delta_max ({delta_max:g}) "
            "from both 1 (a column's normalised variance, eq. 4) and 0 (a column constant at "
            "the midpoint of its bounds), so no data would lie in the protected class S_n "
            "(eq. 6); declare a normalised covariance"
        )
    return ref


def release(
    X: ArrayLike | RowSource,
    m: int,
    delta_max: float,
    rng: np.random.Generator | None = None,
    *,
    reference: ArrayLike | None = None,
    progress: Callable[[float], None] | None = None,
) -> CompressedRelease:
    """Compress ``X`` (``n x p``, values in ``[-1, 1]``) to ``Phi X`` (``m x p``), paper 002.

    ``delta_max`` is the curator's ``Delta_max`` (eq. 5-6): the entrywise distance of
    normalised covariances that defines the protected class ``S_n``. ``reference`` is
    the declared ``Sigma_1`` (see the module docstring for what omitting it means).
    ``rng`` is accepted for the library's uniform signature and not used: ``Phi`` comes
    from OpenDP's CSPRNG and nothing is post-processed.

    ``progress`` is called with the fraction done of the work after the first read of
    the rows (the covariance): the draw of ``Phi`` and its product with the rows, block
    by block (rows projected over ``n``). It draws nothing: ``Phi`` is the same with it
    or without.
    """
    del rng
    source = as_source(X)
    n, p = source.n_rows, source.n_cols
    delta_max = _check_delta_max(delta_max)
    if isinstance(m, bool) or not isinstance(m, int | np.integer):
        raise MechanismError("m must be an integer")
    m = int(m)
    lower = min_rows(n, p)
    if m < lower:
        raise MechanismError(
            f"m ({m}) must be >= 2 (C1 + C2) ln(2np) = {lower} for n = {n}, p = {p} (Lemma 4.4)"
        )
    if m >= n:
        raise MechanismError(f"m ({m}) must be smaller than n ({n}): the release compresses rows")
    check_projection_size(n, p, m)
    # a declared reference is checked before the data are read: its refusal is the request's
    declared = None if reference is None else check_reference(reference, p, delta_max)
    sigma, scale = _normalised_covariance(source)
    if declared is None:
        sigma_1 = sigma
        kind: ReferenceKind = "data"
    else:
        sigma_1 = declared
        kind = "declared"
        if np.max(np.abs(sigma - sigma_1)) > delta_max:
            raise MechanismError(
                "the data lie outside the protected class S_n: an entry of their normalised "
                "covariance differs from the reference by more than delta_max (eq. 6)"
            )
    alpha = None  # with the data as reference, a statistic of the data: not computed
    if kind == "declared":
        eigenvalues = np.linalg.eigvalsh(sigma_1)
        alpha = alpha_bound(n, p, m, delta_max, float(eigenvalues[0]), float(eigenvalues[-1]))
    radius = truncation_radius(n, p, m, delta_max)
    matrix, _ = _draw(source, scale, m, sigma_1, radius, progress)
    return CompressedRelease(
        matrix=matrix, n=n, delta_max=delta_max, alpha=alpha, reference_kind=kind
    )
