"""The synthesis linear program of paper 000 (Algorithm 1 step 20), solved with HiGHS.

Given the ``R x C`` matrix ``W`` of basis values on ``C`` candidate points
(``W_{rk} = T_r(s_k)``, step 14) and the noisy moments ``b_hat`` (step 9), find weights

    u* = argmin_u || W u - b_hat ||_1   subject to   u >= 0,  sum_k u_k = 1,

a probability distribution on the candidates whose moments are closest to the noisy ones
in L1. This is pure post-processing of ``b_hat``: it reads no data.

Formulation (the standard form of appendix A.1.3, eq. 4, without the integer scaling):
slack variables ``p, q >= 0`` with ``W u + p - q = b_hat`` and ``1^T u = 1``, objective
``1^T p + 1^T q``; at the optimum ``p + q = |W u - b_hat|``. There are ``C + 2R`` columns
and ``R + 1`` rows, passed to HiGHS as one compressed-column sparse matrix.

Solvers (``solver=``):

* ``"simplex"`` -- HiGHS dual simplex: a *vertex* solution, so at most ``R + 1`` candidates
  get positive weight (the paper's CPLEX solution has the same property).
* ``"ipm"`` -- HiGHS interior point *without crossover*: an optimal point in the relative
  interior of the optimal face when that face is not a single vertex, which spreads the
  mass over many candidates. Tiny negative entries left by the IPM are clipped to 0 and
  the weights renormalised; the reported ``objective`` is recomputed on those weights.

:func:`round_to_grid` is the paper's optional rounding of ``W`` and ``b_hat`` to the
grid ``L = {i/L : i = -L..L}`` (steps 10 and 15), which only serves the bit-complexity
bound of Theorem 3.1; it is off by default.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms.errors import MechanismError, SolverError

SOLVERS = ("simplex", "ipm")


@dataclass(frozen=True, eq=False)
class LPSolution:
    """Weights on the candidates and what the solver reported.

    ``objective`` is ``||W u - b_hat||_1`` at the returned ``weights``;
    ``solver_objective`` is HiGHS's own value; ``seconds`` is the wall time of building
    and solving (all attempts); ``iterations`` counts simplex or IPM iterations of the
    attempt that succeeded; ``fallback`` is ``""`` for the first attempt, ``"presolve"``
    for the retry with presolve, ``"crossover"`` when the IPM needed crossover (a vertex).
    """

    weights: NDArray[np.float64]
    objective: float
    solver_objective: float
    status: str
    solver: str
    seconds: float
    iterations: int
    fallback: str = ""

    def info(self) -> dict[str, Any]:
        """JSON-safe summary: status, objective, time, iterations, support size."""
        return {
            "solver": self.solver,
            "status": self.status,
            "objective": self.objective,
            "solver_objective": self.solver_objective,
            "seconds": self.seconds,
            "iterations": self.iterations,
            "support_size": int(np.count_nonzero(self.weights)),
            "fallback": self.fallback,
        }


def fit_weights(
    W: ArrayLike,
    b_hat: ArrayLike,
    *,
    solver: str = "simplex",
    time_limit: float | None = None,
) -> LPSolution:
    """Solve ``min ||W u - b_hat||_1`` over the probability simplex (module docstring).

    Raises :class:`MechanismError` for malformed input and :class:`SolverError` when
    HiGHS does not reach an optimal solution (with its status in the message).
    """
    started = time.perf_counter()
    matrix = np.asarray(W, dtype=np.float64)
    target = np.asarray(b_hat, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise MechanismError(f"W must be a non-empty (R, C) matrix; got shape {matrix.shape}")
    R, C = matrix.shape
    if target.shape != (R,):
        raise MechanismError(f"b_hat must have shape ({R},); got {target.shape}")
    if not (np.all(np.isfinite(matrix)) and np.all(np.isfinite(target))):
        raise MechanismError("W and b_hat must be finite")
    if solver not in SOLVERS:
        raise MechanismError(f"solver ({solver!r}) must be one of {SOLVERS}")
    if time_limit is not None and not (math.isfinite(time_limit) and time_limit > 0):
        raise MechanismError(f"time_limit ({time_limit!r}) must be a positive number of seconds")

    # Presolve finds nothing to remove in this dense LP and was 3/4 of the solve time at
    # R = 30, C = 10^4 (0.27 s of 0.37 s on the 2-core machine), so the first attempt runs
    # without it. IPX (the IPM) occasionally stops with "no progress" (status Unknown) on
    # these LPs (about 1 in 100 benchmark instances); the same model with presolve on
    # solved the cases we kept. If that fails too, the IPM runs once more with crossover,
    # which returns an optimal *vertex*; `fallback` in the result says so.
    attempts: list[tuple[str, bool, str]] = [("off", False, ""), ("on", False, "presolve")]
    if solver == "ipm":
        attempts.append(("off", True, "crossover"))
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    status_text = "not run"
    model_status = None
    fallback = ""
    for presolve, crossover, label in attempts:
        fallback = label
        remaining = None if deadline is None else deadline - time.perf_counter()
        if remaining is not None and remaining <= 0:
            break
        highs = _solve(matrix, target, solver, presolve, crossover, remaining)
        model_status = highs.getModelStatus()
        status_text = highs.modelStatusToString(model_status)
        if model_status == highspy.HighsModelStatus.kOptimal:
            break
    if model_status != highspy.HighsModelStatus.kOptimal:
        raise SolverError(
            f"HiGHS ({solver}) did not solve the synthesis LP with {R} moments and {C} "
            f"candidates: status {status_text!r}"
        )
    info = highs.getInfo()
    raw = np.asarray(highs.getSolution().col_value, dtype=np.float64)[:C]
    weights = np.clip(raw, 0.0, None)
    total = float(weights.sum())
    if not (math.isfinite(total) and total > 0):
        raise SolverError(f"HiGHS ({solver}) returned weights that do not sum to a positive value")
    weights /= total
    iterations = int(
        info.simplex_iteration_count if solver == "simplex" else info.ipm_iteration_count
    )
    return LPSolution(
        weights=weights,
        objective=float(np.abs(matrix @ weights - target).sum()),
        solver_objective=float(info.objective_function_value),
        status=status_text,
        solver=solver,
        seconds=time.perf_counter() - started,
        iterations=iterations,
        fallback=fallback,
    )


def _solve(
    matrix: NDArray[np.float64],
    target: NDArray[np.float64],
    solver: str,
    presolve: str,
    crossover: bool,
    time_limit: float | None,
) -> highspy.Highs:
    highs = highspy.Highs()  # type: ignore[no-untyped-call]
    highs.silent()
    highs.setOptionValue("solver", "simplex" if solver == "simplex" else "ipm")
    highs.setOptionValue("run_crossover", "on" if crossover else "off")
    highs.setOptionValue("presolve", presolve)
    if solver == "simplex":
        # Every entry of W is in [-1, 1] and the slack columns are +-1: scaling buys nothing
        # and measured 1.4-2.5x slower (R = 100, C = 10^4: 2.8 s -> 1.5 s without it).
        highs.setOptionValue("simplex_scale_strategy", 0)
    if time_limit is not None:
        highs.setOptionValue("time_limit", float(time_limit))
    status = _pass_slack_model(highs, matrix, target)
    # kWarning: HiGHS dropped matrix entries below its small_matrix_value (1e-9): products
    # of many Chebyshev factors can be that small; they do not change the fit.
    if status == highspy.HighsStatus.kError:
        R, C = matrix.shape
        raise SolverError(f"HiGHS rejected the synthesis LP ({R} rows, {C} candidates)")
    highs.run()
    return highs


def round_to_grid(values: ArrayLike, L: int) -> NDArray[np.float64]:
    """Nearest point of ``{i/L : i = -L, ..., L}`` (paper 000, Algorithm 1 steps 10, 15)."""
    if isinstance(L, bool) or not isinstance(L, int | np.integer) or L < 1:
        raise MechanismError(f"rounding grid L ({L!r}) must be a positive integer")
    array = np.asarray(values, dtype=np.float64)
    out: NDArray[np.float64] = np.clip(np.rint(array * L), -L, L) / L
    return out


def lp_bytes(R: int, C: int, solver: str = "simplex") -> int:
    """Estimated peak memory of building and solving the LP, including ``W`` itself.

    Measured peak (maxrss) at ``R = 100, C = 5 10^4``: 83 bytes per entry of ``W`` for the
    simplex, 145 for the IPM (HiGHS keeps column- and row-wise copies, IPX factor data);
    the estimate rounds up to 96 and 160.
    """
    per_entry = 96 if solver == "simplex" else 160
    return per_entry * R * C + 200 * (C + 2 * R)


def _pass_slack_model(
    highs: highspy.Highs, W: NDArray[np.float64], b_hat: NDArray[np.float64]
) -> Any:
    """Pass ``[W  I  -I; 1^T 0 0] [u; p; q] = [b_hat; 1]``, costs ``[0; 1; 1]``, columns >= 0.

    Uses HiGHS's array overload of ``passModel`` (numpy buffers); filling a ``HighsLp``
    field by field converts element by element and took 0.3 s for ``C = 5 10^4``.
    """
    R, C = W.shape
    block_t = np.empty((C, R + 1), dtype=np.float64)  # candidate columns with the sum row
    block_t[:, :R] = W.T
    block_t[:, R] = 1.0
    nonzero = block_t != 0.0
    if np.all(nonzero):
        candidate_rows = np.tile(np.arange(R + 1, dtype=np.int32), C)
        candidate_values = block_t.ravel()
        counts = np.full(C, R + 1, dtype=np.int64)
    else:  # exact zeros (e.g. T_1(0) on the full grid) are left out of the sparse matrix
        candidate_rows = np.nonzero(nonzero)[1].astype(np.int32)
        candidate_values = block_t[nonzero]
        counts = nonzero.sum(axis=1)
    n_col = C + 2 * R
    start = np.zeros(n_col + 1, dtype=np.int64)
    np.cumsum(np.concatenate([counts, np.ones(2 * R, dtype=np.int64)]), out=start[1:])
    if start[-1] >= np.iinfo(np.int32).max:
        raise MechanismError(f"the synthesis LP has {start[-1]} nonzeros, more than HiGHS takes")
    slack_rows = np.arange(R, dtype=np.int32)
    index = np.concatenate([candidate_rows, slack_rows, slack_rows])
    value = np.concatenate([candidate_values, np.ones(R), -np.ones(R)])
    rhs = np.concatenate([b_hat, [1.0]])
    return highs.passModel(
        n_col,
        R + 1,
        int(value.size),
        int(highspy.MatrixFormat.kColwise),
        int(highspy.ObjSense.kMinimize),
        0.0,
        np.concatenate([np.zeros(C), np.ones(2 * R)]),
        np.zeros(n_col),
        np.full(n_col, highspy.kHighsInf),
        rhs,
        rhs.copy(),
        start[:-1].astype(np.int32),
        index,
        value,
        np.zeros(n_col, dtype=np.int32),  # every column continuous
    )
