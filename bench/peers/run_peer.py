"""Run MST or AIM (smartnoise-synth) on data in [-1, 1]^d; for bench/smooth_marginals.py.

Runs in the peers venv (bench/peers/requirements.txt), not the service's:

    .peers/bin/python bench/peers/run_peer.py mst in.npy out.npy EPS DELTA BINS SEED ROWS

Each column is cut into BINS equal-width bins of [-1, 1] (public, like our bins), the
synthesizer is fitted on the bin codes (all columns categorical), ROWS rows are sampled
and each code is placed uniformly inside its bin. Prints the fit-and-sample seconds.
"""

import sys
import time
import warnings

import numpy as np
import pandas as pd

warnings.filterwarnings("ignore")


def main() -> None:
    method, src, dst, eps, delta, bins, seed, rows = sys.argv[1:9]
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
    synth.fit(frame, categorical_columns=list(frame.columns), preprocessor_eps=0.0)
    out = synth.sample(int(rows)).to_numpy().astype(float)
    seconds = time.time() - started
    rng = np.random.default_rng(seed_i)
    np.save(dst, -1 + (out + rng.uniform(size=out.shape)) * (2 / n_bins))
    print(f"seconds {seconds:.3f}")


if __name__ == "__main__":
    main()
