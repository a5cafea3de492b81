"""Run MST or AIM (smartnoise-synth) on data in [-1, 1]^d; for bench/smooth_marginals.py.

Runs in the peers venv (bench/peers/requirements.txt), not the service's:

    .peers/bin/python bench/peers/run_peer.py mst in.npy out.npy EPS DELTA BINS SEED ROWS [iid.npy]

Each column is cut into BINS equal-width bins of [-1, 1] (public, like our bins), the
synthesizer is fitted on the bin codes (all columns categorical), ROWS rows are sampled
and each code is placed uniformly inside its bin. Prints the fit-and-sample seconds.

``iid.npy`` (optional): ROWS more rows drawn i.i.d. from the same fitted model
(:func:`iid_rows`), written there. smartnoise's own ``sample`` draws with mbi's randomized
rounding (``MarkovRandomField.synthetic_data(method="round")``): each column's values are
dealt to the rows of a parent value in row order, by stratified uniforms, so every column
rises with the row's position inside its parent's group and two columns that the model
makes independent given their parent come out comonotone (on a toy model, root of 2
values with two uniform 8-value children: correlation 1.00 given the root, against 0.00
with ``method="sample"``; ``rounding_coupling.py``). That is dependence the model does not
hold and no measurement paid for; the i.i.d. rows show what the model itself gives.

Each column's domain is declared: all BINS codes, fitted on the codes themselves
(:func:`public_transformer`), not on the data. Left to itself, smartnoise fits its
categorical encoder on the data (``preprocessor_eps=0`` spends nothing), so the peer
would learn for free which bins are empty. Our releases pay for that knowledge or do
without it, so that would break privacy rule 1 in the peers' favour. Results before
2026-11-24 were made that way; the tables say which.
"""

import sys
import time
import warnings
from typing import Any

import numpy as np
import pandas as pd

warnings.filterwarnings("ignore")


def public_transformer(columns: list[str], n_bins: int) -> Any:
    """A smartnoise encoder whose categories are the public codes ``0 .. n_bins - 1`` of
    every column (fitted on those codes, so no category comes from the data)."""
    from snsynth.transform import LabelTransformer, TableTransformer

    transformer = TableTransformer([LabelTransformer(nullable=False) for _ in columns])
    every_code = pd.DataFrame(
        np.tile(np.arange(n_bins)[:, None], (1, len(columns))), columns=columns
    )
    transformer.fit(every_code)
    return transformer


def iid_rows(synth: Any, rows: int) -> Any:
    """``rows`` codes drawn i.i.d. from the fitted model of ``synth`` (mbi's
    ``synthetic_data(method="sample")``), then decoded as the synthesizer's own ``sample``
    decodes its rows: MST undoes its domain compression, AIM puts the columns in order."""
    data = synth.synthesizer.synthetic_data(rows=rows, method="sample")
    if hasattr(synth, "undo_compress_fn"):
        frame = synth.undo_compress_fn(data).df
    else:
        frame = data.df[[f"col{i}" for i in range(synth._transformer.output_width)]]
    codes = [tuple(t[1:]) for t in frame.itertuples()]
    return synth._transformer.inverse_transform(codes)


def placed(codes: np.ndarray, n_bins: int, rng: np.random.Generator) -> np.ndarray:
    """Bin codes back in ``[-1, 1]``: each value uniform inside its bin."""
    return -1 + (codes + rng.uniform(size=codes.shape)) * (2 / n_bins)


def main() -> None:
    method, src, dst, eps, delta, bins, seed, rows = sys.argv[1:9]
    iid_dst = sys.argv[9] if len(sys.argv) > 9 else None
    eps_f, delta_f, n_bins, seed_i = float(eps), float(delta), int(bins), int(seed)
    np.random.seed(seed_i)  # the synthesizers draw from numpy's global state
    X = np.load(src)
    codes = np.clip(np.floor((X + 1) / 2 * n_bins).astype(int), 0, n_bins - 1)
    frame = pd.DataFrame(codes, columns=[f"c{i}" for i in range(X.shape[1])])
    started = time.time()
    if method == "mst":
        from snsynth.mst import MSTSynthesizer

        synth = MSTSynthesizer(epsilon=eps_f, delta=delta_f)
    elif method == "aim":
        from snsynth.aim import AIMSynthesizer

        synth = AIMSynthesizer(epsilon=eps_f, delta=delta_f)
    else:
        raise SystemExit(f"unknown method {method!r}")
    synth.fit(frame, transformer=public_transformer(list(frame.columns), n_bins))
    out = synth.sample(int(rows)).to_numpy().astype(float)
    seconds = time.time() - started
    rng = np.random.default_rng(seed_i)
    np.save(dst, placed(out, n_bins, rng))
    if iid_dst is not None:
        np.save(iid_dst, placed(np.asarray(iid_rows(synth, int(rows)), dtype=float), n_bins, rng))
    print(f"seconds {seconds:.3f}")


if __name__ == "__main__":
    main()
