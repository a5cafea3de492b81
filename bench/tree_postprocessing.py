"""Issue 7: paired evaluation of the marginal tree's post-processing.

Run from the repository root:

    python -m bench.tree_postprocessing [--rounds 8] [--settings 1.5:3:copula:2,1:none:blocks]

Why paired: the thresholds and the joint model of :mod:`app.mechanisms.marginal_tree`
(``one_way_threshold``, ``table_threshold``, ``joint_model``, ``temper`` and
``one_way_shape`` of ``TreeMeasurements``)
act after the measurement, so one release can be read under every setting. OpenDP's
noise is unseeded and the round-to-round spread of a release's error (about +-0.03x the
baseline on WDBC and CRM) hides effects of 0.01x when each setting gets releases of its
own; on the same noise, the per-round difference between two settings varies far less,
and its mean and standard error resolve them.

Protocol: the queries of ``bench/smooth_marginals.py`` (paper 000 §4, uniform centres at
sigma in {2, 4, 6, 8, 10}; centres at real rows plus N(0, 0.1^2) jitter at sigma in {1, 2};
per-column min/max normalisation, benchmark only). Each round makes one release,
``marginal_tree.measure`` with its defaults at ``epsilon = 1, delta = 1e-9``, and scores
the answers the service returns (the exact expectation under the tree law) under every
setting ``one_way:table:joint[:temper[:shape]]`` (``table = none``: the plain projection of
each pair table; ``joint``: ``copula`` or ``blocks``, ``marginal_tree.JOINT_MODELS``;
``temper`` the exponent of ``marginal_tree.temper_tree``, ``marginal_tree.TEMPER`` when left
out; ``shape`` the one-way marginals' shape, ``marginal_tree.ONE_WAY_SHAPES``, ``unimodal``
when left out).
Cells: worst-case relative error as a multiple of the 0-DP uniform baseline, mean over
rounds, and the mean paired difference to the first setting with its standard error
(``sd / sqrt(rounds)`` of the per-round differences).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from app.mechanisms import marginal_tree
from bench._common import Run
from bench.smooth_marginals import (
    DELTA,
    FAMILY_KEYS,
    _product_law_ratios,
    _scored_families,
)
from bench.smooth_synthetic import DATA_DIR, load_datasets

Setting = tuple[float, float | None, str, float, str]

_ONE_WAY, _TABLE = marginal_tree.ONE_WAY_THRESHOLD, marginal_tree.TABLE_THRESHOLD
_TEMPER = marginal_tree.TEMPER
_SHAPE = marginal_tree.ONE_WAY_SHAPES[0]
#: The default first (every difference is taken to it), then how records of version 5
#: (free one-way shape), version 4 (untempered), version 3 (blocks) and version 2 (blocks,
#: plain projections: ``LEGACY_THRESHOLDS``) read the same release, another exponent, and
#: one threshold changed at a time around the default.
DEFAULT_SETTINGS: tuple[Setting, ...] = (
    (_ONE_WAY, _TABLE, "copula", _TEMPER, _SHAPE),
    (_ONE_WAY, _TABLE, "copula", _TEMPER, "free"),
    (_ONE_WAY, _TABLE, "copula", 1.0, "free"),
    (_ONE_WAY, _TABLE, "blocks", 1.0, "free"),
    (*marginal_tree.LEGACY_THRESHOLDS, "blocks", 1.0, "free"),
    (_ONE_WAY, _TABLE, "copula", 3.0, _SHAPE),
    (1.0, _TABLE, "copula", _TEMPER, _SHAPE),
    (2.0, _TABLE, "copula", _TEMPER, _SHAPE),
    (_ONE_WAY, None, "copula", _TEMPER, _SHAPE),
    (_ONE_WAY, 2.0, "copula", _TEMPER, _SHAPE),
    (_ONE_WAY, 4.0, "copula", _TEMPER, _SHAPE),
)


def parse_settings(text: str) -> list[Setting]:
    """``"1.5:3:copula:3,1:none:blocks:2:free"`` -> ``[(1.5, 3.0, "copula", 3.0,
    "unimodal"), (1.0, None, "blocks", 2.0, "free")]``; ``ValueError`` on anything else (a
    threshold is a finite number >= 0, ``none`` only for the table; the joint model one of
    ``marginal_tree.JOINT_MODELS``; the exponent a finite number >= 1; the shape one of
    ``marginal_tree.ONE_WAY_SHAPES``)."""
    out: list[Setting] = []
    for item in text.split(","):
        parts = [part.strip() for part in item.split(":")]
        if len(parts) not in (3, 4, 5):
            raise ValueError(f"a setting is one_way:table:joint[:temper[:shape]], not {item!r}")
        one_way = float(parts[0])
        table = None if parts[1].lower() == "none" else float(parts[1])
        for value in (one_way, table):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"thresholds must be finite and >= 0, not {item!r}")
        if parts[2] not in marginal_tree.JOINT_MODELS:
            raise ValueError(f"the joint model is one of {marginal_tree.JOINT_MODELS}: {item!r}")
        temper = float(parts[3]) if len(parts) >= 4 else _TEMPER
        if not (math.isfinite(temper) and temper >= 1):
            raise ValueError(f"the exponent is a finite number >= 1, not {item!r}")
        shape = parts[4] if len(parts) == 5 else _SHAPE
        if shape not in marginal_tree.ONE_WAY_SHAPES:
            raise ValueError(f"the shape is one of {marginal_tree.ONE_WAY_SHAPES}: {item!r}")
        out.append((one_way, table, parts[2], temper, shape))
    if len(set(out)) != len(out):
        raise ValueError("a setting is listed twice")
    return out


def label(setting: Setting) -> str:
    one_way, table, joint, temper, shape = setting
    table_text = "none" if table is None else f"{table:g}"
    return f"{one_way:g}:{table_text}:{joint}:{temper:g}:{shape}"


def read_as(tree: marginal_tree.TreeMeasurements, setting: Setting) -> Any:
    """The same measurements under other post-processing (the noisy frequencies, tables
    and tree are shared; the law is rebuilt)."""
    one_way, table, joint, temper, shape = setting
    return dataclasses.replace(
        tree,
        one_way_threshold=one_way,
        table_threshold=table,
        joint_model=joint,
        temper=temper,
        one_way_shape=shape,
    )


def run(
    data: dict[str, np.ndarray],
    rounds: int,
    n_queries: int,
    settings: list[Setting],
    log: Any = print,
) -> dict[str, Any]:
    """Every setting on every dataset, one release per round shared by the settings."""
    if rounds < 2:
        raise ValueError("a paired standard error needs at least 2 rounds")
    if len({label(s) for s in settings}) != len(settings):
        raise ValueError("a setting is listed twice (the same label)")
    keys = FAMILY_KEYS
    result: dict[str, Any] = {"datasets": {}}
    for name, X in data.items():
        n, d = X.shape
        batches, truth, base = _scored_families(X, n_queries)
        ratios = np.empty((len(settings), rounds, len(keys)))
        for r in range(rounds):
            tree = marginal_tree.measure(X, 1.0, DELTA)
            for s, setting in enumerate(settings):
                got = _product_law_ratios(batches, truth, base, read_as(tree, setting))
                ratios[s, r] = [got[k] for k in keys]
            log(f"{name} round {r + 1}/{rounds}")
        diff = ratios - ratios[:1]
        rows = {}
        for s, setting in enumerate(settings):
            rows[label(setting)] = {
                "one_way_threshold": setting[0],
                "table_threshold": setting[1],
                "joint_model": setting[2],
                "temper": setting[3],
                "one_way_shape": setting[4],
                "ratio": dict(zip(keys, ratios[s].mean(axis=0).tolist(), strict=True)),
                "difference": dict(zip(keys, diff[s].mean(axis=0).tolist(), strict=True)),
                "stderr": dict(
                    zip(
                        keys,
                        (diff[s].std(axis=0, ddof=1) / math.sqrt(rounds)).tolist(),
                        strict=True,
                    )
                ),
            }
        result["datasets"][name] = {
            "n": n,
            "d": d,
            "pair_bins": tree.pair_bins,
            "grouping": tree.grouping,
            "bins": tree.one_way.bins,
            "bound_atoms": tree.one_way.atoms,
            "baseline": base,
            "rows": rows,
        }
    return result


def render_markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    keys = FAMILY_KEYS
    lines = [
        "# Issue 7: the marginal tree's post-processing, paired",
        "",
        "Produced by `python -m bench.tree_postprocessing` (protocol in its docstring). One "
        f"release per round ({s['rounds']} rounds, `marginal_tree.measure` defaults, epsilon = "
        f"1, delta = {DELTA}), read under every setting `one-way threshold : table threshold "
        ": joint model : temper : shape` (noise standard deviations; `none`: the plain "
        "projection of each pair table; `copula`: fine tables from a Gaussian copula raked to "
        "the coarse ones, `blocks`: independent inside a pair of coarse groups, as before "
        "version 4; temper: the exponent of each copula edge's dependence ratio, 1 before "
        "version 5; shape: `unimodal`, each column's bins between its atoms projected onto "
        "the unimodal laws where the release has atoms, `free` before version 6). "
        f"{s['queries']} queries per family. Cells: worst-case relative error as a multiple of "
        "the 0-DP uniform baseline (mean over rounds), then in brackets the mean paired "
        "difference to the first row (the default) +- its standard error; a negative "
        "difference means the setting beat the default on the same noise.",
        "",
    ]
    for name, entry in result["datasets"].items():
        lines += [
            f"## {name} (n = {entry['n']}, d = {entry['d']}; B = {entry['bins']}"
            f"{' + atoms' if entry['bound_atoms'] else ''}, {entry['grouping']} groups, "
            f"b = {entry['pair_bins']})",
            "",
        ]
        head = ["one-way : table : joint : temper : shape", *keys]
        lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for position, (row_label, row) in enumerate(entry["rows"].items()):
            cells = []
            for k in keys:
                cell = f"x{row['ratio'][k]:.3f}"
                if position > 0:  # the first row is the reference
                    cell += f" ({row['difference'][k]:+.3f} +- {row['stderr'][k]:.3f})"
                cells.append(cell)
            lines.append(f"| {row_label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="WDBC,CTG,PKS,CRM")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument(
        "--settings",
        default=",".join(label(s) for s in DEFAULT_SETTINGS),
        help=(
            "one_way:table:joint[:temper[:shape]] settings, comma separated; the first is the "
            "reference"
        ),
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    try:
        settings = parse_settings(args.settings)
    except ValueError as exc:
        parser.error(str(exc))
    command = "python -m bench.tree_postprocessing " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    bench = Run("tree_postprocessing", command)
    data = load_datasets(args.datasets.split(","), args.data_dir)
    result = run(data, args.rounds, args.queries, settings)
    result["settings"] = {
        "rounds": args.rounds,
        "queries": args.queries,
        "settings": [label(s) for s in settings],
    }
    bench.write(render_markdown(result), result)


if __name__ == "__main__":
    main()
