"""A tree of two-way histograms: select-measure-generate for smooth queries (issue 7).

Why this exists
---------------
:mod:`app.mechanisms.marginals` keeps no dependence between columns, and on queries that
test joint structure (Gaussian kernels centred at real rows, ``sigma <= 2``) even the
exact product of the true marginals scores 0.2-0.6x the 0-DP baseline. A tree of coarse
two-way tables on top of the fine one-column histograms, built from the exact tables,
cuts that by 25-45 % (row-centred ``sigma = 1``: WDBC 0.55 -> 0.42, CTG 0.36 -> 0.26,
PKS 0.19 -> 0.11; ``bench/results/smooth_marginals_tree.md``, "exact tables"), and MST
(McKenna et al. 2021) is the private version of that idea. This module is that idea with
our replace-one accounting, our fine one-way histograms, and exact answers for separable
queries.

What it buys at ``epsilon = 1, delta = 1e-9`` (``bench/results/smooth_marginals.md``: 20
rounds of ours, 3 of the peers, in one run; the default grouping of each dataset, version
4's copula law; +- standard errors over the rounds): on the row-centred ``sigma = 1``
queries the error drops from 0.28x to 0.10x the baseline on PKS (5875 rows, 21 columns;
MST and AIM: 0.21x) and from 0.46x to 0.26x +- 0.01x on CTG (2126 x 21; MST: 0.23x +-
0.03x); on the uniform-centre queries at ``sigma >= 4`` it is at 0.18-0.19x on WDBC (569 x
30; marginals 0.21-0.23x, MST 0.24-0.25x, AIM 0.37-0.38x), level with
:mod:`~app.mechanisms.marginals` on CTG and below it on PKS (the halved one-way budget is
won back by the coarse margins the tables also measure), and on CRM (1994 x 100;
``smooth_marginals_crm.md``, 20 rounds beside 5 of MST) at 0.18-0.20x, level with
:mod:`~app.mechanisms.marginals` (0.18-0.21x) and with MST (0.18-0.23x +- 0.02-0.03x:
behind it at ``sigma = 2, 4``, 1.30x and 1.14x, ahead at ``sigma >= 6``, 0.86-0.91x,
all within two standard errors of 1 but ``sigma = 2``). The worst case over a
family's queries varies widely from one release to the next: on CTG row-centred
``sigma = 1``, 40 releases ranged 0.17-0.38x (mean 0.286x +- 0.008x), so one 10-round run
can read 0.25x and the next 0.29x. With 10 rounds of MST beside 20 of ours
(``smooth_marginals_mst10.md``) the CTG row-centred gap is plain: 0.28x +- 0.009x
against MST's 0.22x +- 0.01x (``sigma = 2``: 0.08x against 0.06x); on WDBC the tree is
below MST everywhere (rows ``sigma = 1`` 0.69x against 0.73x). It is the default of
``smooth_synthetic`` when ``delta > 0``.

Mechanism (three data-dependent steps, accounted in zCDP, converted once)
--------------------------------------------------------------------------
The budget ``(epsilon, delta)`` (``delta > 0``) is turned into the largest ``rho`` whose
zCDP-to-approximate-DP conversion (OpenDP's) stays within it, and split by :data:`SHARES`.
zCDP composes additively, also when a step is chosen adaptively from earlier outputs
(Bun & Steinke 2016, Lemma 2.3), so the three steps together are ``rho``-zCDP.

1. **One-way histograms** (share ``rho_1``): the ``d`` fine histograms of
   :func:`app.mechanisms.marginals.exact_histograms` (``B + 2 atoms`` cells per column),
   vector Gaussian, L2 sensitivity ``sqrt(2 d) / n`` (:mod:`~app.mechanisms.marginals`,
   step 2), ``s_1 = Delta / sqrt(2 rho_1)``. Post-processing gives each column's projected
   marginal ``p_i`` and its *coarse* marginal ``P_i`` over ``b`` groups of consecutive
   cells (see "Coarse groups": a function of public values and of this step's output).
2. **Selection** (share ``rho_s``), ``d - 1`` rounds as in MST: among the pairs that join
   two components of the tree so far, pick one with OpenDP's noisy max (Gumbel,
   ``ZeroConcentratedDivergence``) on the scores

       score_ij = n || T_ij - P_i (x) P_j ||_1,

   ``T_ij`` the exact ``b x b`` coarse table of columns ``i, j`` and ``P_i (x) P_j`` the
   product of step 1's released coarse marginals (fixed given step 1). Replace-one moves
   one count of ``n T_ij`` out of a cell and one into another, so each score moves by at
   most 2: L-infinity sensitivity 2 (counts; :func:`score_sensitivity` adds a bound on
   the floating-point rounding of the scores, ``~1e-10``), and each round is
   ``rho_s / (d - 1)``-zCDP (:func:`app.mechanisms.noise.noisy_max_scale`).
3. **Pair tables** (share ``rho_2``): the ``d - 1`` selected coarse tables ``T_ij``,
   vector Gaussian; a replaced row leaves one cell and enters another in every table, so
   the L2 sensitivity is ``sqrt(2 (d - 1)) / n`` (plus the rounding of ``counts / n``,
   :func:`pair_table_sensitivity`; steps 1 and 3 declare their sensitivities through
   :func:`app.mechanisms.noise.float_sensitivity`).

Coarse groups
-------------
Each column's ``B + 2 atoms`` fine cells are merged into ``b`` runs of consecutive cells
before steps 2 and 3 read a row; the grouping depends only on public values and on step
1's released marginal ``p_i``, so steps 2 and 3 are chosen adaptively from a DP output
(composition above) and their sensitivities do not change (a row still sits in exactly one
coarse cell of every table):

* ``"equal"``: ``group(cell) = floor(cell b / cells)``, by position alone;
* ``"quantile"`` (:func:`quantile_groups`): group ``k`` ends where ``p_i``'s cumulative
  mass reaches ``(k + 1) / b``, so the groups carry about equal mass;
* ``"blend"`` (:func:`blend_groups`): the quantile groups of the mixture
  ``(1 - lambda) p_i + lambda u`` with ``u`` uniform over the cells and ``lambda =``
  :data:`BLEND` ``= 1/2`` (``lambda = 0`` is ``"quantile"``, ``lambda = 1`` is
  ``"equal"``).

Equal-width groups keep a column's tails apart, which the row-centred queries need, but on
a skewed column they put nearly all the mass in one group and leave the other cells little
signal; equal-mass groups split the bulk and merge the tails; the blend does some of both.
:func:`default_grouping` takes ``"quantile"`` when a pair table's per-cell noise exceeds
the mass of an average cell (``s_2 > 1 / b^2``): there only groups of equal mass rise above
the noise. Otherwise the choice is between groups that do not move with the noise
(``"equal"``) and blend groups, whose boundaries are drawn from step 1's released marginal:
the blend when that marginal is precise, its per-cell noise below half an average fine
cell's mass (``s_1 (B + 2 atoms) <`` :data:`BLEND_NOISE_LIMIT` ``= 1/2``), equal groups
otherwise. At ``epsilon = 1, delta = 1e-9``: WDBC (``s_2 = 0.11``) quantile; CTG
(``s_1 (B + 2) = 0.42``) and PKS (0.28) blend; CRM (0.81) equal. The limit sits between
CTG and CRM, chosen on these four datasets.

Why the blend became the default with the copula law (version 4, "Joint law inside the
groups"): each table now also sets the shape of its fine table through the correlation
fitted to it, and a group holding nearly all of a skewed column's mass tells it little.
In ``bench/results/smooth_marginals.md`` (10 rounds each, not paired), blend against equal
groups: CTG row-centred ``sigma = 1`` 0.318x -> 0.247x the baseline, ``sigma = 2`` 0.094x
-> 0.061x, uniform level (0.038-0.047x); PKS uniform ``sigma = 2`` 0.031x -> 0.022x, rows
0.124x -> 0.101x and 0.035x -> 0.027x; the equal-privacy run agrees (CTG rows 0.279x ->
0.258x, PKS 0.124x -> 0.090x). On CRM the blend was better at ``sigma = 2, 4`` (0.475x,
0.191x -> 0.456x, 0.184x) but worse at ``sigma >= 6``, 0.186-0.194x -> 0.202-0.223x, and
0.202-0.218x -> 0.253-0.277x in the equal-privacy run (``smooth_marginals_crm.md``,
``smooth_marginals_equal_privacy_crm.md``), as it was under the block law.

Measured under the block law (versions 1-3, when equal groups were the default; side
runs, paper-000 protocol, the three groupings on the same data; the releases are not
paired, so differences of a few hundredths are within the round noise):

* WDBC (10 and 20 rounds; equal only in the first), uniform ``sigma >= 4``: quantile
  0.19-0.21x the baseline, blend 0.19-0.22x, equal 0.23-0.25x; rows ``sigma = 1``:
  quantile 0.71-0.73x, blend 0.74-0.75x.
* CTG (8 and 16 rounds; quantile only in the first): uniform ``sigma >= 4`` blend
  0.035-0.043x, equal 0.041-0.047x, quantile 0.049-0.053x; rows ``sigma = 1`` blend
  0.344-0.345x, equal 0.365-0.370x, quantile 0.378x.
* PKS (8 and 16 rounds; quantile only in the first): uniform ``sigma = 2`` blend
  0.027-0.028x, equal 0.038x, quantile 0.026x; ``sigma >= 4`` blend 0.017-0.018x, equal
  0.017-0.023x, quantile 0.025x; rows ``sigma = 1`` blend 0.148-0.154x, equal
  0.150-0.159x, quantile 0.207x.
* CRM (two runs of 5 rounds), uniform ``sigma >= 6``: blend 0.18-0.23x, equal
  0.16-0.21x, quantile 0.17-0.24x; ``sigma = 2`` blend 0.45-0.49x, equal 0.46-0.49x.

Post-processing (free):

* **Coarse margins from every measurement.** Column ``i``'s coarse marginal is measured
  once by step 1 (the sum of its fine cells in each group: noise variance
  ``m_k s_1^2`` for a group of ``m_k`` cells) and once more by each selected table that
  holds it (a row or column sum of ``b`` cells: ``b s_2^2``), all with independent noise.
  Their inverse-variance weighted mean (the least-squares estimate), projected onto the
  simplex, is ``P_i``; the fine marginal ``p_i`` of step 1 (projected as in
  :mod:`~app.mechanisms.marginals`) is rescaled inside each group to sum to ``P_i`` (spread
  evenly over the group's cells where step 1 left the group empty). This is the
  consistency Private-PGM gets from all measurements at once; here it cut the worst-case
  error on CRM at ``sigma >= 4`` by about a third (``bench/results/smooth_marginals_tree.md``).
* **Denoising by thresholds.** Where the data has no mass, a noisy cell is pure noise, and
  the simplex projection keeps the noisy cells that land above its cut, spreading mass where
  there is none: the law becomes more diffuse than the data, and every row-centred query is
  underestimated (all 1000 of them on CTG, median -21 % to -28 %). So the fine marginal
  ``p_i`` is step 1's with cells below :data:`ONE_WAY_THRESHOLD` ``= 1.5`` noise standard
  deviations set to 0 (``MarginalMeasurements.marginals``; the grouping keeps the 1 standard
  deviation it was measured with), and each pair table keeps only the cells at or above
  :data:`TABLE_THRESHOLD` ``= 3`` times ``s_2`` before its projection
  (:func:`~app.mechanisms.marginals.denoise`). Paired side runs (each release read with both
  settings; 12 rounds, CRM 6; ``epsilon = 1, delta = 1e-9``), the plain projections
  (version 2) -> these thresholds: CTG rows ``sigma = 1`` 0.375x -> 0.325x the baseline,
  ``sigma = 2`` 0.103x -> 0.088x, uniform 0.040-0.048x -> 0.038-0.045x; PKS rows 0.153x ->
  0.138x and 0.039x -> 0.036x, uniform ``sigma >= 4`` 0.018-0.021x -> 0.017-0.019x; WDBC
  uniform ``sigma >= 4`` 0.199-0.213x -> 0.192-0.201x, rows 0.734x -> 0.718x; CRM uniform
  ``sigma = 4`` 0.203x -> 0.195x, ``sigma = 6`` 0.181x -> 0.171x, rows ``sigma = 2`` 0.731x
  -> 0.713x, the rest within 0.005x. A one-way threshold of 2 did better still on CTG, PKS
  and WDBC but cost CRM (``sigma = 2, 4``: 0.528x, 0.229x); thresholds chosen per column by
  Stein's unbiased risk estimate won only on CRM; with the thresholds, finer tables
  (``b = 6, 8``) still did not beat ``b = 4`` on CTG. Empirical-Bayes posterior means
  instead of the one-way thresholds (one prior for all of a release's one-way cells, its
  nonparametric maximum-likelihood estimate by EM, as in Jiang and Zhang 2009; paired, 6 to
  16 rounds) also won only on CRM, at ``sigma >= 6`` (0.21-0.22x -> 0.17-0.18x), and lost
  elsewhere: CRM ``sigma = 2`` 0.505x -> 0.534x and rows ``sigma = 2`` 0.695x -> 0.736x, CTG
  rows ``sigma = 1`` 0.307x -> 0.325x, WDBC uniform 0.20-0.22x -> 0.21-0.24x, PKS worse by
  0.001-0.003x. Read on the same noise, tilting the thresholded law to the empirical-Bayes
  first two moments lost the same row-centred accuracy: the thresholds' bias towards a more
  concentrated law than the noisy histograms imply is what the row-centred queries want
  from a tree that is more diffuse than the data. Records of version 1 and 2 keep the plain
  projections (:data:`LEGACY_THRESHOLDS`), so a stored release answers as it did.
* Each denoised table is raked (iterative proportional fitting) to ``P_i``, ``P_j``, so
  that the tree model

    p(x) = prod_i p_i(c_i) / |c_i|  *  prod_{(i, j) in tree} T_ij(g_i, g_j) / (P_i(g_i) P_j(g_j))

  (``c_i`` the fine cell of ``x_i``, ``|c_i|`` its width, ``g_i`` its group) is a
  probability law with one-column marginals ``p_i`` (a Markov tree over the coarse
  groups; inside a group, a column's fine cell is drawn from ``p_i`` and its position
  uniformly in the cell, as in :mod:`~app.mechanisms.marginals`). This is the
  ``"blocks"`` law (``TreeMeasurements.coarse_model``; every record before version 4).

Joint law inside the groups
---------------------------
Under ``"blocks"`` two neighbouring columns are independent inside each pair of groups:
each coarse cell's mass is spread over its whole square of fine cells, so the law is more
diffuse than data whose columns move together, and every row-centred query is
underestimated. ``joint_model = "copula"`` (:data:`JOINT_MODELS`, the default of version
4) refines each edge to a table over the *fine* cells (:func:`fit_copula_table`):

1. a Gaussian copula table with the edge's fine marginals,
   ``G_r(a, b) ~ p_i(a) p_j(b) c_r(z_a, z_b)`` with ``c_r`` the bivariate normal copula
   density of correlation ``r`` and ``z`` the normal scores of the cells' middles
   (:func:`copula_tables`), raked to ``p_i``, ``p_j``;
2. ``r`` picked on :data:`COPULA_CORRELATIONS` so that ``G_r``'s sums over the coarse
   groups are nearest (least squares) the edge's denoised, raked coarse table ``T_ij``;
3. ``G_r`` raked to ``p_i``, ``p_j`` and to ``T_ij`` together (:func:`rake_fine`;
   iterative proportional fitting over three families of margins, consistent because
   ``T_ij`` is raked to the group sums of ``p_i`` and ``p_j``).

The law is then a Markov tree over the fine cells: the same one-column marginals ``p_i``,
the same coarse two-way tables ``T_ij`` on the edges, and inside a pair of groups the
shape of a Gaussian copula instead of a product (Sklar's theorem; the Gaussian copula is
the dependence model of DPCopula, Li, Xiong and Jiang 2014, here fitted to our noisy coarse
tables as post-processing, not measured). Dependence that is not Gaussian inside a pair of
groups is still held to the measured coarse table.

Measured on the same releases read both ways (``bench/results/tree_postprocessing.md``:
10 releases per dataset, ``epsilon = 1, delta = 1e-9``, the default groupings; blocks ->
copula, x the 0-DP baseline, paired standard errors <= 0.002x): row-centred
``sigma = 1``, PKS 0.122x -> 0.101x, CTG 0.305x -> 0.281x, WDBC 0.715x -> 0.712x;
row-centred ``sigma = 2``, CRM 0.705x -> 0.699x, PKS 0.030x -> 0.027x, CTG 0.084x ->
0.079x; uniform ``sigma = 2``, CRM 0.494x -> 0.483x, PKS 0.026x -> 0.022x; the one loss,
CRM uniform ``sigma >= 6``, 0.191-0.209x -> 0.195-0.212x (+0.003-0.004x; within 0.002x
in an earlier run of the harness); every other cell within 0.001x. With equal groups on
CTG and PKS (the earlier default) the gains were alike (rows ``sigma = 1``: CTG 0.304x ->
0.286x, PKS 0.145x -> 0.117x). The fit takes 0.04-0.29 s per release here (CRM, 99 edges
of 14 x 14 cells, the slowest; every edge's tables are raked at once, which took it from
0.12-0.53 s edge by edge with the same results to the bit), next to 0.1-0.6 s for the
measurement.

Tried on the same releases and not taken (8 rounds each): fitting ``r`` to the raw noisy
table instead of the denoised one (level or worse everywhere, CTG rows ``sigma = 1``
+0.009x); and leaving out step 3's rake to ``T_ij`` (a pure copula tree with the fine
margins): better on CTG (uniform -0.003-0.004x, rows ``sigma = 1`` -0.013x) and CRM (up to
-0.008x) and on the row-centred queries of WDBC (-0.018x) and PKS (-0.007x), but worse on
the uniform-centre queries of WDBC (+0.005-0.008x) and PKS (+0.001x), where the measured
coarse tables carry what the one-parameter copula misses. Nor do finer tables pay with
the copula (CTG, 9 rounds, the same releases read raked / pure copula; rows ``sigma =
1``, ``sigma = 2``): ``b = 4`` blend (the default) 0.252x / 0.251x, 0.062x / 0.061x;
``b = 4`` equal 0.291x / 0.309x, 0.081x / 0.090x; ``b = 6`` equal 0.314x / 0.315x,
0.105x / 0.106x; ``b = 8`` equal 0.389x / 0.371x, 0.132x / 0.128x. From the exact tables
the pure copula tree reads 0.253x, 0.198x, 0.180x and 0.245x there (raked: 0.243x,
0.186x, 0.169x, 0.241x), so its one correlation per edge carries nearly all the tree's
joint structure, and the finer tables lose it to the noise of every step, not to the
rake, nor to the table threshold (the same ``b = 6, 8`` releases read with
:data:`TABLE_THRESHOLD` 3, 2, 1 or none, 10 rounds: 0.32-0.33x and 0.37-0.39x whatever
the threshold); ``b = 3`` and ``b = 5`` blend (3 rounds) read 0.29x and 0.34x.
Sharpening each fitted correlation before the rake (``r -> tanh(kappa atanh r)``,
``kappa = 1.3, 1.6, 2``; CTG, 12 releases read each way) moved every cell by at most
0.002x: the rake to ``T_ij`` puts the dependence back where the table has it.

Tempering
---------
The tree law is more diffuse than the data: it underestimates the row-centred queries
(on PKS every one of them, median -5 % to -7 % at ``sigma = 1``; "Where the 0.07x is",
below), and the exact-tables tree reads 0.243x on CTG rows ``sigma = 1`` where a Gaussian
tree with the same edges reads 0.150x: the coarse tables leave each edge's fine
dependence weaker than it is. Version 5 (:data:`TEMPER` ``= 2``) therefore raises each
edge's dependence ratio to a power before the law is read (:func:`temper_tree`):

    t'_ij = rake(p_i (x) p_j * (t_ij / (p_i (x) p_j))^tau; p_i, p_j),

which keeps every one-column marginal ``p_i`` and the tree, and moves each edge towards
more dependence. On a Gaussian copula table of correlation ``r``: ``c_r(u, v)`` is ``exp(r
u v / (1 - r^2))`` times a function of ``u`` and one of ``v``, which the rake absorbs, so
``c_r^tau`` raked is the copula table of the ``r'`` with ``r' / (1 - r'^2) = tau r / (1 -
r^2)`` (``tau = 2``: 0.3 -> 0.50, 0.5 -> 0.69, 0.8 -> 0.89). The law then departs from the
measured coarse tables, which the rake of version 4 held it to; sharpening the copula's
correlation *before* that rake (``r -> tanh(kappa atanh r)``, above) moved nothing,
because the rake put the measured dependence back. It is post-processing of released
values with a public constant, so the privacy argument is unchanged. Side runs (6 releases
per dataset, each read with every ``tau``, paired differences to ``tau = 1`` +- standard
errors; ``epsilon = 1, delta = 1e-9``), rows ``sigma = 1``: ``tau = 2`` CTG -0.011x +-
0.004x (from 0.290x), PKS -0.009x +- 0.002x (from 0.100x), WDBC -0.003x +- 0.003x; ``tau =
3`` CTG -0.017x +- 0.008x and -0.009x +- 0.004x in a second run, PKS -0.012x +- 0.003x and
-0.014x +- 0.005x, WDBC -0.005x and -0.009x, CRM (4 releases) 0.000x; ``tau = 5, 8`` gave
the gain back on CTG and PKS and cost the uniform-centre queries 0.002-0.007x. The
uniform-centre queries moved by at most 0.001x at ``tau = 2, 3`` (they depend on the
one-column marginals, which tempering keeps); the mean error over the row-centred queries
fell more than the worst case (PKS ``sigma = 1`` 0.062x -> 0.047x at ``tau = 2``). ``tau =
2`` is taken over 3: nearly the gain, with a smaller departure from the measured tables.
In ``bench/results/tree_postprocessing_temper.md`` (8 releases per dataset read with ``tau
= 2, 1, 3``), reading the default's releases untempered (``tau = 1``, version 4) costs CTG
rows ``sigma = 1`` +0.012x +- 0.008x (from 0.253x), ``sigma = 2`` +0.009x +- 0.004x,
uniform +0.001-0.003x; PKS rows ``sigma = 1`` +0.008x +- 0.002x (from 0.091x); WDBC is
level within its noise (rows ``sigma = 1`` -0.003x +- 0.007x, uniform ``sigma = 2``
+0.006x +- 0.006x). ``tau = 3`` reads 0.004-0.005x lower again on CTG and PKS rows ``sigma
= 1``. On CRM (``tree_postprocessing_temper_crm.md``, 6 releases) untempered costs rows
``sigma = 2`` +0.005x +- 0.002x (from 0.694x) and uniform +0.001-0.004x, each within two
standard errors; ``tau = 3`` is level with 2.

Unimodal one-way marginals
--------------------------
After the threshold and the projection, a column's fine marginal still carries the noise
of every cell that passed: bumps and dips that the data, most often rising to one mode
and falling, does not have, and a law more diffuse than the data. Version 6
(``one_way_shape = "unimodal"``, :data:`ONE_WAY_SHAPES`) therefore projects each column's
denoised *bins* (its two atoms stay as they are) onto the unimodal vectors, the nearest in
L2 (:func:`marginals.unimodal_projection`: a non-decreasing then a non-increasing
isotonic regression, the best of every split; Frisén 1986, Stout 2008), before the
marginal is rescaled to the coarse groups. The projection pools runs of cells into their
mean, so it keeps each column's mass and non-negativity. A column whose projection moves
it by more than the noise explains keeps its denoised law (:func:`shaped_marginals`: the
squared move in noise variances above the :data:`SHAPE_TEST_LEVEL` ``= 0.999`` quantile of
chi-square on the degrees of freedom the pooling took, :func:`pooled_degrees`): two modes
the noise could not have made stay two modes (a spike of five noise standard deviations
two empty cells from the mode is kept; one of four is pooled). It is post-processing of
released values with public constants, so the privacy argument is unchanged, and the
grouping (computed from step 1's marginal as measured) does not move.

Only where the release has atoms (:func:`marginals.resolve`: by default where the one-way
noise of the whole budget is below ``marginals.ATOM_NOISE_LIMIT = 0.03``, or as a request
sets ``bound_atoms``): without them a column's mass at a bound sits in its edge bin, and CRM, whose
columns pile at both bounds (no atoms at its noise), lost at every uniform ``sigma >= 4``
(side runs, 4 releases read both ways, not paired across settings: 0.18-0.23x ->
0.29-0.36x with every cell in the projection, 0.20-0.22x with the edge bins held apart as
atoms are), where the pooled bound mass shifts every column's mean the same way and the
errors add over its 100 columns; WDBC (no atoms) moved within its noise (rows ``sigma =
1`` 0.697x -> 0.683x, uniform -0.001x to -0.008x). Paired
(``bench/results/tree_postprocessing_shape.md``, 10 releases per dataset, each read with
and without the shape; differences to the shape +- standard errors), reading without it
(version 5) costs CTG rows ``sigma = 1`` +0.014x +- 0.005x (from 0.250x), ``sigma = 2``
+0.011x +- 0.002x (from 0.062x), and gains uniform -0.004x to -0.005x +- 0.003-0.004x
(from 0.040-0.049x); on PKS it costs everywhere: rows +0.013x +- 0.002x (from 0.080x) and
+0.006x +- 0.001x (from 0.018x), uniform +0.002x to +0.004x +- 0.001x (from
0.013-0.016x). The shape test kept 0 % of CTG's and about 5 % of PKS's columns free in
side runs with a test on every bin's degree of freedom (the pooled degrees are the
sharper test, adopted for the spike above). In the equal-privacy run of
``bench/results/smooth_marginals_equal_privacy.md`` (10 releases per dataset, peer rows
copied from the earlier run), the default tree divided by the better of MST and AIM then
read on PKS 0.15-0.32 (uniform) and 0.43, 0.45 (rows ``sigma = 1, 2``): every cell at or
below issue 7's 0.5; on CTG rows 0.67 and 0.45 (version 5: 0.79 and 0.59), uniform
0.22-0.24 (0.18-0.21); WDBC, without atoms, as before within its noise.

Beyond a tree (tried, not taken)
--------------------------------
On CTG the row-centred ``sigma = 1`` error of the tree from the *exact* tables is 0.245x
the baseline, close to the private tree's, so what is left there is the tree model, not
the noise. Without noise, more pair tables would
close much of that gap. Take 50 000 points drawn from the exact tree law and reweight them
by iterative proportional fitting to *every* exact coarse ``4 x 4`` pair table (210
tables); the error falls to 0.07x (``sigma = 2``: 0.040x -> 0.009x). With noise it does not
pay at ``epsilon = 1``. The test (a side script, 3 rounds per setting): the private tree at
0.8 or 0.9 of ``rho``, plus ``K`` extra ``2 x 2`` tables measured with the rest
(``K = d - 1`` or ``(d - 1) / 2``, on the tree's two-hop pairs ranked by the dependence
the tree implies, a choice that reads no data). Each noisy table was projected, raked to
the tree law's margins and fitted onto a sample of that law by iterative proportional
fitting. Rows ``sigma = 1`` went from 0.24-0.30x (the full tree, same rounds) to
0.30-0.34x, and uniform from 0.04-0.05x to 0.06x. Pairs chosen by their exact misfit
(not private) did no better than the full tree (0.27-0.29x). The tree loses more from
the budget taken away than the extra tables win back. Within trees, the best ceiling
measured on CTG rows ``sigma = 1`` is 0.169x (equal groups, ``b = 6``, copula; ``b = 4``
blend 0.243x, ``b = 8`` blend 0.227x) and MST's own model from exact tables (8 equal bins,
``8 x 8`` tables, blocks) reads 0.201x (``sigma = 2``: 0.028x, ours 0.031-0.040x): no tree
of pairs reaches half of MST's 0.23x there even without noise.

Nor does a Gaussian copula, the one joint model whose parameters are all pairwise
(``bench/results/joint_ceiling.md``: each column's exact values, correlations of the exact
normal scores, ``10^5`` points sampled; not private). On CTG rows ``sigma = 1`` the
Chow-Liu Gaussian tree reads 0.150x, one, two and three factors 0.192x, 0.135x, 0.122x,
and the full correlation matrix (210 correlations, all exact) 0.102x; WDBC 0.154x,
0.205x, 0.115x, 0.101x, 0.094x; PKS 0.063x for the tree, 0.088-0.124x for the factors.
Half of MST's 0.23-0.24x is 0.12x, so on CTG a copula would have to measure every
correlation with noise that adds under 0.02x. It adds far more: measured privately
(side script, 3 rounds; step 1 the fine histograms of :mod:`~app.mechanisms.marginals`
at ``rho / 2``, step 2 the normal-score second moments ``Z^T Z / n`` at ``rho / 2``, each
row's scores clipped to ``||z||^2 <= d`` so that a replaced row moves the 231 moments by
at most ``2 d / n`` in L2, noise 0.16 per moment on CTG and 0.86 on WDBC), the full
copula reads 0.44x on CTG rows ``sigma = 1`` and its rank-1 to rank-3 truncations
0.43-0.44x, against the default tree's 0.28x; uniform ``sigma >= 4`` 0.064-0.069x against
0.04-0.05x. A tree measures ``d - 1`` pairs at a noise it can afford; the copula's
budget is spread over ``d (d + 1) / 2`` moments, each moved by a whole row's ``||z||^2``.
The Gaussian tree's 0.150x is also a pointer inside trees: placed uniformly in CTG's
fine cells (``B = 15`` + atoms, one sample of ``5 10^4`` points) it reads 0.18x, so of the
0.09x between it and our tree from the exact tables (0.243x) about 0.03x is the fine
cells and 0.06x the tree the ``4 x 4`` coarse tables select, not their coarseness: the
exact fine tables on that tree read 0.241x (the selection score, below); the noise adds
0.04x more.

Nor, at ``epsilon = 1``, do latent classes, though without noise they go furthest. A
mixture of products over ``K`` clusters of the rows (columns independent given the
cluster) carries dependence that is not pairwise. With the exact one-column laws inside
k-means clusters (``bench/results/joint_ceiling.md``) it reads, on rows ``sigma = 1``,
0.156x, 0.124x and 0.081x on CTG at ``K = 4, 8, 16`` (the full copula 0.102x), 0.038x on
PKS at ``K = 16`` (0.074x) and 0.086x on WDBC (0.094x). Its parameters are measured at the
one-way histograms' sensitivity: each row sits in one cell of each of the ``d`` tables of
cluster by column, so replace-one moves them by ``sqrt(2 d) / n`` in L2 whatever ``K`` is.
The catch is ``K`` times less mass in a cell. The test (side scripts, CTG, rows ``sigma =
1``): the tree at ``(1 - beta) rho`` (its three shares scaled); ``K = 8`` centres by
k-means on ``2 10^4`` points of the released tree law (post-processing), each real row
given its nearest centre (a function of the row and public values); the ``d`` tables of
cluster by coarse group (``K x 4``) measured with Gaussian noise at ``beta rho``,
thresholded at 3 noise standard deviations, projected, and raked to the cluster shares
(the mean of the ``d`` tables' row sums, projected) and to the tree's coarse marginals;
then ``10^5`` points of the tree law reweighted by iterative proportional fitting to those
tables and to the fine one-way marginals. From exact tables and an exact tree this reads
0.126x (``K = 16``: 0.117x; the tree alone 0.242x). Privately (4 rounds, worst | mean):
the full tree 0.273x | 0.139x, rows ``sigma = 2`` 0.062x, uniform 0.035-0.050x;
``beta = 0.3`` 0.249x | 0.089x, 0.085x, 0.049-0.072x; ``beta = 0.5`` 0.291x | 0.145x,
0.130x, 0.065-0.096x. Shrinking each noisy table towards the one the tree law implies
(weight from the residual's excess over the noise variance) instead of the thresholds read
0.295x | 0.164x at ``beta = 0.3``; taking ``beta`` from the pair tables' share alone (5
rounds; 0.15 and 0.25) read 0.327x and 0.331x against the full tree's 0.253x. The mean
error on rows ``sigma = 1`` falls, as the ceiling promises, but the worst case barely moves
and every other family pays for the budget taken from the tree. The mixture alone, on our
fine cells (``B = 15`` + atoms, centres from the exact tree law's sample, exact
per-cluster histograms) reads 0.173x at ``K = 8`` and 0.146x at ``K = 16``; privately its
``K d (B + 2)`` cells would each carry the one-way noise (0.018 at the whole ``rho``)
against an average mass of ``1 / (17 K)`` (0.007 at ``K = 8``), so it was not tried.

Nor, at ``epsilon = 1``, do one-way histograms in a principal-component basis, though
with the basis given they go far. The Gaussian kernel ``exp(-||x - c||^2 / 2 sigma^2)``
is the same in any orthonormal basis, so a product of marginals along the data's principal
axes carries the dependence that the axes absorb. Without noise (side script; each
rotated coordinate's exact values shuffled independently, rotated back) it reads, on rows
``sigma = 1``, 0.121x on WDBC and 0.150x on CTG (``independent`` in
``bench/results/joint_ceiling.md``: 0.552x, 0.363x). Privately, with the *exact* basis
and centre (not private) and the whole budget on the ``d`` or the top ``k`` rotated
histograms (:mod:`~app.mechanisms.marginals`, each coordinate scaled into ``[-1, 1]``
by the public bound ``||v||_1``; 3 rounds): CTG ``k = 6`` reads 0.021-0.033x uniform,
0.107x and 0.024x on rows (the issue's targets there: 0.09-0.13x, 0.175x, 0.06x), but
WDBC ``k = 6`` 0.18-0.47x uniform and 0.35-0.61x rows, and ``k = d`` is worse on both
(the ``||v||_1`` range wastes the bins). The basis and centre are the catch: a private
covariance is noise at these sizes (the normal-score attempt above: 0.16 per moment on
CTG, 0.86 on WDBC), and taking them from a tree released at half the budget
(post-processing of its law's sample; CTG, ``k = 8``, 2 rounds) read 0.12-0.22x uniform
and 0.19-0.33x rows ``sigma = 1`` with the tree's centre, and 0.06x uniform, 0.20x rows
only with the data's exact centre and the histograms at a further ``epsilon = 1`` (1.5
in all): not a release that beats the tree at the same budget.

Nor does pooling step 1's noise across columns (post-processing: the ``d x (B + 2)``
matrix of noisy frequencies, read with the public noise ``tau``; side scripts, 500
queries per family). Two estimators borrow strength between columns. The first is James
and Stein's positive part, each column's histogram shrunk towards the columns' mean
histogram. The second is a low rank: the matrix's singular values, in units of
``tau sqrt(max(d, B + 2))``, kept where they exceed the noise edge ``1 + sqrt(beta)``
(``beta`` the ratio of the shorter side to the longer), the rest set to 0. It kept rank 2-3
of 6 on WDBC, 6-7 of 17 on CTG, 5-6 of 14 on CRM and 8-9 of 31 on PKS.

* On the product of the marginals (:mod:`~app.mechanisms.marginals`, 4 rounds, not
  paired across runs), the shrinkage gained on WDBC's uniform ``sigma >= 4`` in one run
  (0.22-0.25x -> 0.18-0.21x) and lost in another (0.18-0.21x -> 0.19-0.23x), and lost
  on CTG and CRM (CRM ``sigma = 4``: 0.16x -> 0.20x).
* The low rank cut WDBC's rows ``sigma = 1`` from 0.71x to 0.48x and ``sigma = 2`` from
  0.24x to 0.095x, below the exact product law's 0.55x and 0.12x. Its marginals are
  narrower than the data's and offset the spread of a product law; that is bias, not
  knowledge, and it cost WDBC's uniform cells 0.01-0.06x.
* Inside the tree (the group kept from step 1 as measured; the same releases read both
  ways, paired, ``+-`` standard error):
  - WDBC, 5 rounds: uniform +0.000x to +0.010x (+-0.007-0.011x), rows ``sigma = 1``
    -0.025x +- 0.008x, rows ``sigma = 2`` -0.017x +- 0.009x.
  - CTG, 5 rounds: uniform -0.008x (+-0.002-0.004x), rows ``sigma = 1`` -0.015x +- 0.003x
    (0.270x -> 0.255x; the target is 0.177x), rows ``sigma = 2`` -0.002x +- 0.003x.
  - CRM, 3 rounds: ``sigma = 2`` -0.027x +- 0.012x, ``sigma >= 6`` +0.041x to +0.043x
    (+-0.035x); the mean error at ``sigma >= 6`` went from 0.15-0.19x to 0.25-0.32x.
  - PKS, 3 rounds: ``sigma = 2`` +0.007x +- 0.001x, ``sigma >= 4`` -0.002x +- 0.001x,
    rows ``sigma = 1`` -0.008x +- 0.004x.
  - Gavish and Donoho's shrinker of the kept singular values, instead of keeping them,
    cost WDBC's uniform cells +0.009x to +0.011x (+-0.004x) and moved CTG as the hard
    rank did.

No unmet cell comes near its target, and CRM's wide columns lose, so neither estimator
is taken.

Nor does a selection score that ranks the pairs by rank correlation, though on CTG the
tree's edges, not the tables on them, are what its exact-tables ceiling lacks (side
scripts, 1000 queries per family, rows ``sigma = 1``). From the exact data, the exact
*fine* ``17 x 17`` tables on the release's tree (the one the exact ``4 x 4`` L1 scores
pick) read 0.241x, level with the copula law's 0.243x. On the maximum spanning tree of
the normal scores' ``-log(1 - r^2)`` (the Gaussian Chow-Liu tree; 9 of its 20 edges are
the release's), the exact fine tables read 0.156x and the copula law from the exact
coarse tables 0.162x (tempered, ``tau = 2``: 0.110x, against 0.227x on the release's
tree). The Chow-Liu tree of the fine tables' mutual information reads 0.152x. On WDBC
and PKS the tree choice moves little (rows ``sigma = 1``, exact fine tables: 0.321x ->
0.336x and 0.055x -> 0.057x). Privately (CTG, 6-8 releases per setting, not paired; the
other shares scaled to fit):

* The release's L1 score reads 0.250-0.257x +- 0.013-0.019x.
* Spearman's score ``|sum_t (u_ti - 1/2)(u_tj - 1/2)|`` (``u`` the middle of a row's
  fine cell under step 1's released marginal, so a row moves it by at most ``1/2``)
  reads 0.295x at the selection share 0.03 and 0.260x at 0.1.
* The quadrant score ``|sum_t s_ti s_tj - n E s_i E s_j|`` (``s = +-1``, the side of the
  released median; sensitivity 2, twice Spearman's signal per unit of sensitivity for a
  Gaussian copula) reads 0.255x at 0.03 and 0.267x at 0.1.
* A linear score on the coarse groups reads 0.296x.
* Without the selection's noise (``argmax``, not private), with steps 1 and 3 noisy, the
  L1 score reads 0.225x, Spearman's 0.204x and the quadrant's 0.219x.

So even a free, exact Spearman selection would leave CTG above its 0.177x target: the
tables' noise blurs the dependence the better tree carries. The selection's noise takes
the rest. With a per-round share of ``rho_s / 20``, none of these scores picks the tree
better than the L1 score does.

MST's own configuration inside this module does not reach MST either (CTG, side scripts,
10 rounds each, 10^4 queries per family, not paired across settings; rows ``sigma = 1``,
the cell where the default trails MST at the same nominal ``epsilon``). The setting:
``bins = 8`` without atoms, ``b = 8`` equal groups (fine cells = coarse groups), the
blocks law; from the exact tables it reads 0.207x. At our replace-one noise with MST's
shares (a third each) it reads 0.38x (two runs: 0.376x +- 0.016x, 0.381x +- 0.019x).
At MST's own noise it reads 0.30x (0.299x +- 0.012x, 0.298x, 0.287x in three runs).
MST's own noise is the noise its add/remove accounting gives; under replace-one that is
shares ``2/3, 4/3, 2/3`` of ``rho``, ``8/3`` in all (``bench/smooth_marginals.py``,
``--peer-privacy``). So in MST's configuration the stricter neighbour relation costs
0.08x, and 0.07x more separates it from MST's rows (0.22-0.23x). That gap is MST's
sampler, not its Private-PGM estimate ("Where the 0.07x is", below). Our
default, at our noise, reads 0.28-0.31x in these runs: level with MST's configuration at
MST's noise. (Those MST runs read each column's bins off the data; with the bins declared,
MST reads 0.24x +- 0.02x, ``bench/results/smooth_marginals_declared_ctg.md``.) None of
the following closed the 0.07x:

* Its least-squares fit, each noisy table projected in L2 onto ``{T >= 0, rows = P_i,
  cols = P_j}`` instead of threshold, projection and rake: worse on rows ``sigma = 1``,
  +0.038x +- 0.010x (paired, 2 rounds) at MST's configuration and our noise.
* Dropping our thresholds at MST's noise: +0.034x +- 0.010x (paired, 10 rounds).
* Its domain compression (each fine cell with released mass >= ``3 s_1`` its own group,
  all the others one "rare" group, 4.5-6 groups a column): at MST's noise 0.298x against
  0.299x. At our noise with our fine cells, ``b = 6, 8``, it reads 0.44-0.49x.
* A synthetic sample instead of exact answers (``n`` or ``10 n`` rows drawn i.i.d. from
  the default tree law, paired, 8 rounds): 0.312x and 0.314x against 0.314x exact.

Where the 0.07x is (CTG, side scripts, 2000 queries per family, rows ``sigma = 1``).
It is not in MST's estimate, and not in its tree:

* Fed the same noisy measurements at MST's noise (8 equal bins, ``8 x 8`` tables on the
  same tree), mbi's mirror descent (Private-PGM, 5000 iterations, known total), the
  estimate MST uses, reads 0.396x +- 0.005x against our threshold, projection and rake's
  0.304x +- 0.005x (10 rounds, paired). With MST's domain compression added it reads
  0.325x +- 0.006x. That is with the compressed "rare" cell's measurement shrunk by
  ``1 / sqrt(k)`` as smartnoise does (its query is not scaled to match); measured
  without that shrinkage it reads 0.380x. With MST's own selection rule instead of the
  exact tree, both stay where they were: 0.308x ours, 0.336x mbi's.
* MST's own fitted law, read exactly, reads 0.358x +- 0.008x over 8 smartnoise fits, and
  0.355x with ``n`` rows drawn from it i.i.d. Yet the rows smartnoise returns from the
  same fits read 0.253x +- 0.011x. The gain is in its sampler.
* smartnoise samples with mbi's randomized rounding
  (``MarkovRandomField.synthetic_data(method="round")``). It deals each column's values to
  the rows of a parent value in row order, by stratified uniforms. So every column rises
  with the row's position inside its parent's group, and columns the model makes
  independent given their parent come out comonotone. On a toy model (a root of 2 values,
  two uniform 8-value children) they correlate 1.00 given the root, against 0.00 with
  ``method="sample"`` (``bench/peers/rounding_coupling.py``). That is dependence no
  measurement paid for. It helps where the columns rise together, as CTG's do, and costs
  on the uniform ``sigma = 2`` queries (0.209x against 0.188x i.i.d.).
* The same rounding applied to our default tree law (fine cells, copula tables; 8
  releases, 1000 queries) moves little: rows ``sigma = 1`` 0.274x +- 0.016x against
  0.283x exact; ``sigma = 2`` 0.070x against 0.080x; uniform ``sigma = 2`` 0.052x
  against 0.043x. So it is not taken: the release keeps exact answers under its law,
  whose dependence is the measured one.
* In one benchmark run, MST as shipped beside its model sampled i.i.d. (``--peer-iid``,
  ``bench/results/smooth_marginals_peer_iid_{ctg,wdbc,pks}.md``; 5 fits, 1000 queries),
  rows ``sigma = 1`` read: CTG 0.24x against 0.32x, WDBC 0.72x against 0.87x, PKS 0.20x
  against 0.15x. The rounding helps MST where the columns rise together and costs it on
  PKS. Our default divided by MST's model reads 0.86x +- 0.07x on CTG rows ``sigma =
  1``, against 1.18x +- 0.1x divided by MST as shipped.
* The mean relative error over the queries shows the sampler's gain more plainly
  (``bench/results/smooth_marginals_mean_{wdbc_ctg,pks}.md``, as a multiple of the 0-DP
  baseline's mean; 5 fits of each peer). CTG rows ``sigma = 1``: MST as shipped 0.08x,
  its model sampled i.i.d. 0.23x, the default tree 0.17x (1.98x MST as shipped, 0.72x its
  model); PKS rows ``sigma = 2``: 0.01x, 0.02x, 0.02x. On the uniform-centre queries the
  default's mean error is 0.08-0.09x MST's on CTG and 0.13-0.34x on PKS. Our tree law is
  more diffuse than the data: on PKS it underestimates every row-centred query (3
  releases; median -5 % to -7 % at ``sigma = 1``, -1.3 % to -1.8 % at ``sigma = 2``),
  the bias the comonotone rows happen to offset.

On CRM (``d = 100``, where the tree trails MST at ``sigma >= 4``) neither fewer nor
finer tables help (side scripts, ``epsilon = 1, delta = 1e-9``, equal groups, not
paired). A forest of the ``k`` best edges (the noisy max stopped after ``k`` rounds, each
round and table given ``rho_s / k`` and the whole ``rho_2``; unmeasured columns joined
by product tables, which is post-processing), 5 rounds, uniform ``sigma = 4, 6, 8, 10``:
``k = 99`` (the tree) 0.18x, 0.16x, 0.17x, 0.17x; ``k = 50`` 0.16x, 0.20x, 0.22x,
0.22x; ``k = 25`` 0.22-0.26x; ``k = 12`` 0.19-0.24x: at ``sigma >= 6`` each table's row
and column sums, which sharpen the coarse margins, are worth more than the lower noise
per table. Finer tables, 6 rounds (``b = 4, 7, 14``, ``b = 14`` a table over the fine
cells themselves): uniform ``sigma >= 6`` 0.14x, 0.19x, 0.21x; rows ``sigma = 2`` 0.70x,
0.76x, 0.83x.

Nor does a sloped law inside a fine cell (post-processing; side script, 6 releases per
dataset read both ways, 500 queries per family, paired). Each bin's position uniform is
replaced by the linear density of the same mass whose slope is the centred difference of
its neighbours' densities, clipped to stay >= 0 (the frequency polygon's slope). Beyond
the bounds the neighbour was taken as the edge bin itself, as empty, or the slope
extrapolated one-sided. From the exact tables, the empty neighbour cut WDBC's uniform
``sigma >= 4`` error from 0.048-0.058x to 0.027-0.032x (the bounds were each column's min
and max, where the density is near 0) and cost CRM's 0.012-0.015x (its mass piles at the
bounds, where only the extrapolation gained: -0.030x); the interior slopes alone cost
WDBC 0.013-0.027x. Privately, with the empty neighbour: rows ``sigma = 1`` WDBC 0.714x
-> 0.689x, CTG 0.287x -> 0.283x, PKS 0.083x -> 0.079x; rows ``sigma = 2`` WDBC 0.283x
-> 0.262x; uniform within +-0.003x on WDBC, CTG and PKS but CRM ``sigma >= 6`` +0.004x
to +0.005x (+-0.002x). The better edge rule depends on where the data sit against
bounds the curator declares, and the gains are a few hundredths, so the law stays uniform
in a bin.

Where the budget binds (WDBC's uniform-centre queries). At ``sigma >= 4`` a query reads
little but each column's location and spread, and what the released law gets wrong there
is spread over every column, not a few denoising failures (side scripts, WDBC, 3-4
releases, paired): giving each column of a sample of the released law its exact mean and
standard deviation (an oracle) takes uniform ``sigma = 4 .. 10`` from 0.17-0.18x to
0.012-0.074x and rows ``sigma = 2`` from 0.32x to 0.11x; the exact mean alone makes it
worse (0.28-0.33x); the exact mean and spread of only the 3 or 8 columns whose released
spread is furthest off (ratios 0.53-2.47 to the truth) 0.12-0.14x, from 0.16-0.17x in the
same releases. The released first moments
lean towards the middle of the bounds (their error averages +0.03 to +0.07 a column, sd
0.07-0.12; the second moments' averages -0.017 to +0.009), but the spread ratios vary
from column to column, so no common correction removes them. How well any release
could know those locations is in ``bench/results/noise_floor.md``: the exact law with
each column's mean shifted by the Gaussian noise of measuring the ``d`` means alone with
the whole budget (sd 0.111 on WDBC) reads 0.23-0.29x on uniform queries, above this
tree's 0.18-0.22x (which its thresholds and projections buy from the data's sparsity)
and above the issue's target (0.5x AIM, 0.12-0.14x). On CRM the same row reads 0.145x at
``sigma >= 4`` against a target of 0.09-0.12x; and there a law that knows every row but
a row-centred ``sigma = 1`` query's own ten reads 0.59x against a target of 0.50x (those
rows make a median 21 % of an answer), so meeting it takes a release that carries
individual rows.

Answers: a separable query ``sum_j w_j prod_i g_ji(x_i)`` has the exact expectation under
the tree law by belief propagation over the tree (leaves to root):
``V_i(g) = E[g_i(x_i) | group g]`` from the cells' Chebyshev means, message
``m_{c -> p}(g_p) = sum_{g_c} T_cp(g_c | g_p) V_c(g_c) prod_{k child of c} m_{k -> c}(g_c)``,
answer ``sum_g P_root(g) V_root(g) prod m(g)``. Cost ``O(Q J d b^2)`` under ``"blocks"``;
under ``"copula"`` the same recursion runs over the fine cells (each cell its own group),
``O(Q J d (B + 2 atoms)^2)``.

Standard errors (:meth:`TreeMeasurements.stderrs`): the parametric bootstrap of
:mod:`app.mechanisms.bootstrap`, each replicate made by :func:`simulated_measurements`
(steps 1 and 3 simulated under the released law, the tree kept) and refitted by the same
post-processing. Against the spread of answers over independent releases of the same data
(``bench/results/answer_stderr.md``, 20 releases a dataset) they read 0.87-1.13 of it on
the uniform-centre queries and 0.83-1.41 on the row-centred ones, where the tree's own
variability (step 2) is not in the replicates; with the tree fixed, brute force on a small
case reads 0.87 (``tests/mechanisms/test_bootstrap.py``). The model's error is not in
them: ``value +- 1.96 se`` held the truth for 74-97 % of the uniform-centre queries at
``sigma >= 4`` but 0-76 % of the row-centred ones (0-40 % in the run of 2026-11-24,
before record version 6's unimodal one-way shape).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import chdtri, ndtri

from app.mechanisms import bootstrap, marginals, noise
from app.mechanisms.chebyshev import TensorExpansion
from app.mechanisms.data import RowSource, as_source, iter_checked, progress_part
from app.mechanisms.errors import MechanismError
from app.mechanisms.privacy import CostPart, PrivacyCost, check_budget

FORMAT = "smooth_synthetic.marginal_tree/6"
#: Records of version 1 (equal-width groups only, no ``grouping`` key), version 2 (no
#: thresholds: :data:`LEGACY_THRESHOLDS`), version 3 (no ``joint_model``: ``"blocks"``),
#: version 4 (no ``temper``: 1) and version 5 (no ``one_way_shape``: ``"free"``) still
#: load, and answer as they did.
FORMATS = (
    "smooth_synthetic.marginal_tree/1",
    "smooth_synthetic.marginal_tree/2",
    "smooth_synthetic.marginal_tree/3",
    "smooth_synthetic.marginal_tree/4",
    "smooth_synthetic.marginal_tree/5",
    FORMAT,
)
STEPS = ("one_way", "select", "pairs")
#: Shares of ``rho`` for the three steps. MST spends a third on each; our one-way
#: histograms carry the smooth queries at sigma >= 4, so they get half, and the selection
#: gets little: the uniform-centre error depends on the margins the tables add far more
#: than on which edges they sit on (with the exact tree instead of the noisy one, CTG and
#: PKS moved by <= 0.01x the baseline). Moving 0.07 from selection (0.1) to the tables cut
#: the error at sigma >= 4 on CTG from 0.051-0.053x to 0.040-0.047x the baseline (two runs,
#: 8 and 12 rounds) and on CRM, equal groups, from 0.20-0.22x to 0.13-0.15x (10 rounds;
#: CRM sigma = 2 went 0.29x -> 0.32x); PKS did not move beyond the round noise and WDBC's
#: round noise (+-0.03) hid any change (epsilon = 1, delta = 1e-9). The CRM gain did not
#: show in the 5-round benchmarks (sigma >= 6: 0.18x with the old share in
#: ``smooth_marginals_tree.md``, 0.19-0.22x with this one), so it is at least partly noise.
#: With the copula law (version 4) a selection share of 0.06 or 0.1 (the other two scaled
#: down) showed no consistent gain (8-10 rounds, not paired): on CRM 0.1 beat 0.03 in one run
#: (``sigma = 2, 4``: 0.49x, 0.20x -> 0.46x, 0.16x) and not in a second (0.47x, 0.18x ->
#: 0.48x, 0.20x); WDBC got worse (``sigma >= 4`` 0.19x -> 0.21x), PKS a little better.
#: Moving one-way budget to the tables (one_way 0.35 or 0.25, pairs 0.62 or 0.72; 10
#: rounds per dataset, not paired) gave no consistent gain either. CTG rows ``sigma = 2``
#: went 0.080x -> 0.097x and 0.083x; PKS rows ``sigma = 1`` went 0.103x -> 0.108x and
#: 0.111x; CRM ``sigma >= 6`` went 0.16-0.17x -> 0.17-0.18x. WDBC at 0.35 read 0.17-0.19x
#: against 0.21x at ``sigma >= 4``, inside its round noise (standard errors 0.018-0.024x),
#: and at 0.25 it was level. The other way, on CRM alone (10 rounds each, not paired, equal
#: groups forced: with less for the tables the default turns to quantile groups, which
#: cost CRM 0.25-0.36x at ``sigma >= 4``): one_way 0.7 or 0.85 read 0.17-0.22x at
#: ``sigma >= 4`` against 0.20-0.24x at 0.5, rows ``sigma = 2`` 0.70x and 0.71x against
#: 0.68x, ``sigma = 2`` 0.46x against 0.45x: within one or two standard errors (0.01-0.02x)
#: and still behind MST's one round then (0.16-0.20x; 0.18-0.23x over 5 rounds later), so
#: the shares stay.
#: Where the row-centred error on CTG goes (9 rounds, rows ``sigma = 1``): the private tree
#: 0.27x; with the exact tree but the noisy tables and margins 0.23x; with the exact tree
#: and tables 0.22x; with the exact margins only 0.24x; all exact (with the thresholds)
#: 0.21x. So the noisy selection costs the most there, yet buying it back does not pay:
#: selection shares 0.1, 0.2, 0.33 (the other two scaled down; 15 rounds, blend groups)
#: read 0.25x, 0.26x, 0.29x against 0.27x at 0.03 (+-0.01x), with uniform ``sigma >= 4``
#: 0.046-0.049x, 0.054-0.057x, 0.055-0.059x against 0.043-0.046x.
#: Nor does scoring the pairs on finer groups (the selection's own ``8`` blend groups, same
#: budget, the tables still at ``b = 4``; 30 rounds): rows ``sigma = 1`` 0.279x against
#: 0.267x (+-0.009x), uniform ``sigma >= 4`` 0.047-0.051x against 0.044-0.047x.
SHARES = {"one_way": 0.5, "select": 0.03, "pairs": 0.47}
#: Coarse groups per column in the pair tables (``b``).
DEFAULT_PAIR_BINS = 4
#: How a column's fine cells are merged into its ``b`` coarse groups (module doc,
#: "Coarse groups"): ``"blend"`` and ``"quantile"`` from step 1's released marginal,
#: ``"equal"`` by position alone; :func:`default_grouping` picks one from the noise levels.
GROUPINGS = ("blend", "quantile", "equal")
#: Weight ``lambda`` of the uniform law in the ``"blend"`` grouping (module doc).
BLEND = 0.5
#: :func:`default_grouping` takes the blend (when the tables do not call for quantile
#: groups) while step 1's per-cell noise times the number of fine cells is below this.
BLEND_NOISE_LIMIT = 0.5
#: L-infinity sensitivity of the selection scores, in counts, in exact arithmetic (module
#: doc, step 2); :func:`score_sensitivity` adds the floating-point rounding.
SCORE_SENSITIVITY = 2.0
#: Denoising of the fine one-way histograms in the tree law: cells below this many noise
#: standard deviations are empty (``MarginalMeasurements.marginals``; module doc,
#: "Post-processing"). The grouping keeps ``marginals.THRESHOLD``, as measured.
ONE_WAY_THRESHOLD = 1.5
#: The shape the tree law gives each column's denoised fine marginal between its bound
#: atoms (module doc, "Unimodal one-way marginals"): ``"unimodal"``, projected onto the
#: unimodal laws (:func:`shaped_marginals`); ``"free"``, as denoised (every record before
#: version 6, and every release without atoms).
ONE_WAY_SHAPES = ("unimodal", "free")
#: A column keeps its free law when the unimodal projection moves it by more than the
#: noise explains: ``||fit - p||^2 / s_1^2`` above this quantile of chi-square with the
#: degrees of freedom the projection's pooling took (:func:`shaped_marginals`).
SHAPE_TEST_LEVEL = 0.999
#: Denoising of the pair tables: cells below this many noise standard deviations are
#: empty before the projection (``marginals.denoise``; module doc, "Post-processing").
TABLE_THRESHOLD = 3.0
#: ``(one-way, table)`` thresholds of records made before version 3 (``None``: the plain
#: projection of each table).
LEGACY_THRESHOLDS: tuple[float, float | None] = (marginals.THRESHOLD, None)
#: Iterations of proportional fitting when raking a pair table to its margins.
RAKE_ITERATIONS = 50
#: How the tree law joins two columns inside a pair of coarse groups (module doc, "Joint
#: law inside the groups"): ``"copula"``, fine tables from a Gaussian copula fitted to each
#: denoised coarse table and raked to it; ``"blocks"``, independent inside the pair of
#: groups (every record before version 4).
JOINT_MODELS = ("copula", "blocks")
#: The grid the copula correlation of an edge is fitted on: ``tanh`` of 161 equally spaced
#: points of ``[-4, 4]`` (Fisher's z), fine near ``+-1`` (``|r| <= 0.9993``), where two
#: near-copies of one variable sit.
COPULA_CORRELATIONS = np.tanh(np.linspace(-4.0, 4.0, 161))
#: Most entries ``(d - 1) cells^2`` of the tree law's fine edge tables
#: (:func:`check_fit_size`). The copula fit and its 20 bootstrap refits take time in
#: proportion: 50 s at 1.5 10^5 entries here (2 cores; ``d = 10``, 130 cells per column),
#: so ~90 s at the limit; ``bins = 4096`` on two columns would have needed 87 GB at once.
MAX_FINE_TABLE_CELLS = 1 << 18
#: Most columns of a tree. Step 2 runs ``d - 1`` noisy-max rounds over the pairs that join
#: two components, ``~d^3 / 3`` Gumbel draws in all, and counts every pair's table: at
#: ``n = 1000`` the measure took 3 s at ``d = 300``, 12 s at 600, 27 s at 800 and 51 s at
#: 1000 here (2 cores, shared), ``~d^3``; ``d = 2000`` would take some 7 minutes. Wider
#: tables get :mod:`~app.mechanisms.marginals` by default (the adapter's
#: ``default_method``); a request for the tree is refused.
MAX_TREE_COLUMNS = 1000
#: Most work of :func:`all_pair_counts` at request time (:func:`pair_count_work`,
#: ``n d (d - 1) / 2`` pair-rows; ``MAX_TREE_COLUMNS`` above was calibrated at
#: ``n = 1000`` only). Measured here (2 cores shared with other jobs, load ~4, OpenBLAS
#: on 1 or 2 threads) with the one-hot products at ``pair_bins = 4``: 0.6-1.4 ns a
#: pair-row (``n = 10^5, d = 191``: 1.2-2.5 s; ``n = 4 10^5, d = 300``: 15 s, 0.85 ns;
#: ``n = 2 10^4, d = 1000``: 7-9 s); wider tables cost ``(pair_bins / 4)^2`` as much
#: (0.71 ns at 8, 0.53-0.68 ns at 16, per 4 x 4 pair-row). At <= 1.4 ns, 4 10^11 is at most
#: ~9 minutes of counting (5-6 minutes at the usual 0.8 ns): ``d = 1000`` up to 8 10^5
#: rows, ``d = 191`` up to 2.2 10^7.
MAX_PAIR_COUNT_WORK = 4 * 10**11
#: Bytes of candidate tables :func:`fit_copula_table` builds at once (a block of
#: :data:`COPULA_CORRELATIONS` for every edge; at least one correlation). All 161 at once
#: held ~650 fine tables' worth per edge: 2.2 GB for 99 edges of 66 x 66 cells.
COPULA_CHUNK_BYTES = 64 << 20
#: Floor of ``log c_r`` relative to its largest value (:func:`copula_tables`).
COPULA_FLOOR = -30.0
#: Iterations of proportional fitting of each candidate copula table to the fine margins
#: while its correlation is fitted (the chosen one is then raked :data:`RAKE_ITERATIONS`
#: times to the margins and the coarse table together).
COPULA_FIT_ITERATIONS = 15
#: Exponent ``tau`` of each edge's dependence ratio under ``"copula"`` (module doc,
#: "Tempering"): 1 keeps the fitted tables (every record before version 5).
TEMPER = 2.0
#: Iterations of proportional fitting of a tempered table to its fine margins (a sharper
#: table converges more slowly than the fitted one; 200 put the margins within 1e-6 on
#: the tests' tables).
TEMPER_RAKE_ITERATIONS = 200


def fine_table_cells(d: int, cells: int) -> int:
    """``(d - 1) cells^2``: the entries of the law's fine edge tables (module doc, "Joint
    law inside the groups"), which every fit, bootstrap replicate and answer holds."""
    return (d - 1) * cells * cells


def pair_count_work(n: int, d: int, pair_bins: int) -> int:
    """The work of :func:`all_pair_counts` in pair-rows of ``4 x 4`` tables: ``n d (d - 1)
    / 2``, times ``(pair_bins / 4)^2`` for wider tables (its one-hot products grow as
    ``(d pair_bins)^2``; narrower ones cost about as much as ``4 x 4``). Bounded by
    :data:`MAX_PAIR_COUNT_WORK`."""
    return n * (d * (d - 1) // 2) * max(pair_bins, DEFAULT_PAIR_BINS) ** 2 // 16


def check_fit_size(d: int, cells: int) -> None:
    """Refuse a resolution whose fine edge tables exceed :data:`MAX_FINE_TABLE_CELLS`
    (public values only, checked before a row is read)."""
    size = fine_table_cells(d, cells)
    if size > MAX_FINE_TABLE_CELLS:
        most = math.isqrt(MAX_FINE_TABLE_CELLS // max(d - 1, 1))
        raise MechanismError(
            f"{cells} cells per column over {d} columns give (d - 1) cells^2 = {size} "
            f"fine-table entries; the tree law is limited to {MAX_FINE_TABLE_CELLS} (its "
            f"synthesis and answers grow with them): use at most {most} cells per column "
            "(bins plus 2 bound atoms), or method 'marginals'"
        )


def groups(cells: int, pair_bins: int) -> NDArray[np.int64]:
    """Equal grouping: coarse group of each fine cell, ``floor(cell b / cells)`` (public)."""
    out: NDArray[np.int64] = (np.arange(cells) * pair_bins) // cells
    return out


def quantile_groups(p: NDArray[np.float64], pair_bins: int) -> NDArray[np.int64]:
    """``(d, cells)`` quantile grouping of each column's cells from its marginal ``p_i``.

    Group ``k`` ends at the first cell where the cumulative mass reaches ``(k + 1) / b``,
    moved right or left just enough that every group holds at least one cell (so each
    column has exactly ``b`` groups of consecutive cells). A function of ``p`` alone:
    applied to step 1's released marginal it is post-processing."""
    d, cells = p.shape
    b = pair_bins
    if not 1 <= b <= cells:
        raise MechanismError(f"cannot make {b} groups of {cells} cells")
    out = np.empty((d, cells), dtype=np.int64)
    for i in range(d):
        cumulative = np.cumsum(p[i])
        ends: list[int] = []
        for k in range(1, b):
            end = int(np.searchsorted(cumulative, k / b - 1e-12))
            low = ends[-1] + 1 if ends else 0
            ends.append(min(max(end, low), cells - 1 - (b - k)))
        out[i] = np.searchsorted(np.asarray(ends), np.arange(cells), side="left")
    return out


def blend_groups(p: NDArray[np.float64], pair_bins: int) -> NDArray[np.int64]:
    """``(d, cells)`` blend grouping: :func:`quantile_groups` of ``(1 - lambda) p_i +
    lambda / cells`` (``lambda =`` :data:`BLEND`), halfway between equal mass
    (``lambda = 0``) and equal width (``lambda = 1``). A function of ``p`` alone."""
    cells = p.shape[1]
    return quantile_groups(
        (1.0 - BLEND) * np.asarray(p, dtype=np.float64) + BLEND / cells, pair_bins
    )


def default_grouping(pair_scale: float, pair_bins: int, one_way_scale: float, cells: int) -> str:
    """``"quantile"`` when a pair table's per-cell noise exceeds the mass of an average
    cell, ``pair_scale > 1 / b^2`` (then only groups of equal mass carry signal); else
    ``"blend"`` when step 1's per-cell noise is below :data:`BLEND_NOISE_LIMIT` times an
    average fine cell's mass, ``one_way_scale * cells < BLEND_NOISE_LIMIT`` (the blend's
    boundaries are drawn from step 1's released marginal); else ``"equal"`` (module doc,
    "Coarse groups"). Public values only."""
    if pair_scale > 1.0 / pair_bins**2:
        return "quantile"
    return "blend" if one_way_scale * cells < BLEND_NOISE_LIMIT else "equal"


def check_grouping(grouping: str) -> None:
    """Refuse a grouping that is not one of :data:`GROUPINGS`."""
    if grouping not in GROUPINGS:
        raise MechanismError(f"grouping ({grouping!r}) must be one of {', '.join(GROUPINGS)}")


def column_groups(p: NDArray[np.float64], pair_bins: int, grouping: str) -> NDArray[np.int64]:
    """``(d, cells)``: the coarse group of every fine cell of every column, given the
    columns' ``(d, cells)`` marginals ``p`` (for ``"blend"`` and ``"quantile"``;
    ``"equal"`` uses only their shape). The release passes step 1's released marginals:
    public values only."""
    check_grouping(grouping)
    if grouping == "quantile":
        return quantile_groups(p, pair_bins)
    if grouping == "blend":
        return blend_groups(p, pair_bins)
    d, cells = p.shape
    return np.tile(groups(cells, pair_bins), (d, 1))


def group_sums(cell_values: NDArray[np.float64], group: NDArray[np.int64], b: int) -> Any:
    """``(d, b)``: each row of ``(d, cells)`` values summed over its column's groups
    (``group`` is ``(d, cells)``)."""
    return np.stack([np.where(group == k, cell_values, 0.0).sum(axis=1) for k in range(b)], axis=1)


def pair_table_sensitivity(n: int, edges: int) -> float:
    """Declared L2 sensitivity of ``edges`` coarse two-way frequency tables: exact
    ``sqrt(2 edges) / n`` (module doc, step 3) plus the rounding of ``counts / n``. Each
    table is a frequency vector summing to 1 in which a replaced row moves one count out
    and one in, exactly as a one-column histogram, so this is
    :func:`app.mechanisms.marginals.histogram_sensitivity` of ``edges`` histograms."""
    if n < 1 or edges < 1:
        raise MechanismError(f"n ({n}) and edges ({edges}) must be positive")
    return marginals.histogram_sensitivity(n, edges)["l2"]


def rake(table: NDArray[np.float64], rows: NDArray[np.float64], cols: NDArray[np.float64]) -> Any:
    """Iterative proportional fitting of a nonnegative table to margins ``rows``/``cols``
    (cells of a zero row or column stay 0; an empty table starts from the product)."""
    t = np.array(table, dtype=np.float64, copy=True)
    if t.sum() <= 0:
        t = np.outer(rows, cols)
    t = np.where(np.outer(rows > 0, cols > 0), np.maximum(t, 1e-12), 0.0)
    return rake_fine(t, rows, cols, RAKE_ITERATIONS)


def normal_scores(p: NDArray[np.float64]) -> NDArray[np.float64]:
    """``z_c = Phi^{-1}(F(c) - p_c / 2)``: the standard-normal quantile of each cell's
    middle under the law ``p`` (``F`` its cumulative sum; clipped to ``[1e-9, 1 - 1e-9]``,
    so a cell at either end gets a finite score)."""
    middle = np.cumsum(p, axis=-1) - np.asarray(p) / 2.0
    out: NDArray[np.float64] = ndtri(np.clip(middle, 1e-9, 1.0 - 1e-9))
    return out


def copula_tables(
    p_i: NDArray[np.float64], p_j: NDArray[np.float64], correlations: ArrayLike
) -> NDArray[np.float64]:
    """``(..., R, cells_i, cells_j)``: for each correlation ``r`` (and each leading index of
    ``p_i``, ``p_j``: one per edge), the table

        G_r(a, b) = p_i(a) p_j(b) c_r(z_a, z_b),
        c_r(u, v) = (1 - r^2)^{-1/2} exp(-(r^2 (u^2 + v^2) - 2 r u v) / (2 (1 - r^2))),

    ``c_r`` the Gaussian copula density (the bivariate normal density over the product of
    its margins) at the cells' :func:`normal_scores`, normalised to sum 1. ``r = 0`` is the
    product of the margins; its margins are ``p_i``, ``p_j`` only approximately (the
    density is read at one point per cell), which :func:`fit_copula_table` rakes away.
    ``c_r`` is floored at ``e^``:data:`COPULA_FLOOR` times its largest value."""
    r = np.asarray(correlations, dtype=np.float64)[:, None, None]
    u = normal_scores(p_i)[..., None, :, None]
    v = normal_scores(p_j)[..., None, None, :]
    log_c = -0.5 * np.log1p(-(r**2)) - (r**2 * (u**2 + v**2) - 2.0 * r * u * v) / (
        2.0 * (1.0 - r**2)
    )
    # floored at e^-30 of the largest: every cell both margins give mass keeps some, so
    # raking can reach the margins (and nothing underflows to a sum it divides by)
    relative = np.maximum(log_c - log_c.max(axis=(-2, -1), keepdims=True), COPULA_FLOOR)
    table = p_i[..., None, :, None] * p_j[..., None, None, :] * np.exp(relative)
    out: NDArray[np.float64] = table / table.sum(axis=(-2, -1), keepdims=True)
    return out


def rake_fine(
    table: NDArray[np.float64],
    rows: NDArray[np.float64],
    cols: NDArray[np.float64],
    iterations: int,
    blocks: NDArray[np.float64] | None = None,
    group_rows: NDArray[np.int64] | None = None,
    group_cols: NDArray[np.int64] | None = None,
) -> NDArray[np.float64]:
    """Iterative proportional fitting of nonnegative fine tables (``(..., cells_i,
    cells_j)``) to the fine margins ``rows`` (``(..., cells_i)``), ``cols`` (``(...,
    cells_j)``) and, when ``blocks`` (``(..., b, b)``) is given, to the coarse table
    ``blocks[g, h]`` over the groups ``group_rows``, ``group_cols`` (``(..., cells)``) of the
    cells (the three are consistent when ``blocks`` has margins equal to the group sums of
    ``rows`` and ``cols``, as in the tree law). Leading axes broadcast, so the tables of
    every edge of a tree are raked at once."""
    t = np.array(table, dtype=np.float64, copy=True)
    rows, cols = np.asarray(rows)[..., :, None], np.asarray(cols)[..., None, :]
    if blocks is not None:
        if group_rows is None or group_cols is None:
            raise MechanismError("raking to a coarse table needs the groups of the cells")
        to_rows = np.eye(blocks.shape[-2])[group_rows]  # (..., cells_i, b)
        to_cols = np.eye(blocks.shape[-1])[group_cols]  # (..., cells_j, b)
    for _ in range(iterations):
        r = t.sum(axis=-1, keepdims=True)
        t *= np.where(r > 0, rows / np.where(r > 0, r, 1.0), 0.0)
        c = t.sum(axis=-2, keepdims=True)
        t *= np.where(c > 0, cols / np.where(c > 0, c, 1.0), 0.0)
        if blocks is not None:
            current = np.swapaxes(to_rows, -1, -2) @ t @ to_cols
            factor = np.where(current > 0, blocks / np.where(current > 0, current, 1.0), 0.0)
            t *= to_rows @ factor @ np.swapaxes(to_cols, -1, -2)
    return t


def fit_copula_table(
    p_i: NDArray[np.float64],
    p_j: NDArray[np.float64],
    group_i: NDArray[np.int64],
    group_j: NDArray[np.int64],
    coarse: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The fine table of an edge under ``"copula"`` (module doc, "Joint law inside the
    groups"): the correlation ``r`` of :data:`COPULA_CORRELATIONS` whose copula table,
    raked to the fine margins, has coarse sums nearest ``coarse`` (least squares), and that
    table raked to the fine margins and to ``coarse`` together. Public inputs only.

    Every argument may carry leading axes (edges), fitted at once; ``r`` then has them
    too. The candidate tables are built :data:`COPULA_CHUNK_BYTES` at a time (a block of
    correlations for every edge), so the search holds a few fine tables per edge, not
    ``len(COPULA_CORRELATIONS)`` of them; each candidate is raked and scored on its own,
    so the result is the same whatever the block (ties go to the first correlation, as
    with one ``argmin``)."""
    p_i, p_j = np.asarray(p_i), np.asarray(p_j)
    b = coarse.shape[-1]
    lead = p_i.shape[:-1]
    to_rows, to_cols = np.eye(b)[group_i][..., None, :, :], np.eye(b)[group_j][..., None, :, :]
    per_correlation = 8 * max(1, math.prod(lead)) * p_i.shape[-1] * p_j.shape[-1]
    step = max(1, COPULA_CHUNK_BYTES // per_correlation)
    best = np.zeros(lead, dtype=np.int64)
    best_error = np.full(lead, np.inf)
    chosen = np.zeros((*lead, p_i.shape[-1], p_j.shape[-1]))
    for start in range(0, len(COPULA_CORRELATIONS), step):
        candidates = rake_fine(
            copula_tables(p_i, p_j, COPULA_CORRELATIONS[start : start + step]),
            p_i[..., None, :],
            p_j[..., None, :],
            COPULA_FIT_ITERATIONS,
        )  # (..., block, cells_i, cells_j)
        sums = np.swapaxes(to_rows, -1, -2) @ candidates @ to_cols
        errors = ((sums - coarse[..., None, :, :]) ** 2).sum(axis=(-2, -1))
        block_best = np.argmin(errors, axis=-1)
        block_error = np.take_along_axis(errors, block_best[..., None], axis=-1)[..., 0]
        better = block_error < best_error
        best = np.where(better, start + block_best, best)
        best_error = np.where(better, block_error, best_error)
        tables = np.take_along_axis(candidates, block_best[..., None, None, None], axis=-3)
        chosen = np.where(better[..., None, None], tables[..., 0, :, :], chosen)
    table = rake_fine(chosen, p_i, p_j, RAKE_ITERATIONS, coarse, group_i, group_j)
    return COPULA_CORRELATIONS[best].reshape(lead), table


def copula_tree(coarse: TreeModel) -> TreeModel:
    """The ``"copula"`` law from a block law (module doc, "Joint law inside the groups"):
    the same fine marginals and edges, each edge's table from :func:`fit_copula_table` on
    its coarse table (all edges at once), as a Markov tree over the fine cells (each cell
    its own group)."""
    d, cells = coarse.p.shape
    p, g = coarse.p, coarse.group
    i, j = np.array(coarse.edges).T
    _, tables = fit_copula_table(p[i], p[j], g[i], g[j], np.stack(coarse.joint))
    identity = np.tile(np.arange(cells), (d, 1))
    return TreeModel(p=p, P=p, group=identity, edges=coarse.edges, joint=tuple(tables))


def check_temper(tau: float) -> None:
    """Refuse an exponent of :func:`temper_tree` that is not a finite number >= 1."""
    number = isinstance(tau, int | float) and not isinstance(tau, bool)
    if not (number and math.isfinite(tau) and tau >= 1.0):
        raise MechanismError(f"temper ({tau!r}) must be a finite number >= 1")


def temper_tree(model: TreeModel, tau: float) -> TreeModel:
    """The tree law with every edge's dependence ratio raised to ``tau`` (module doc,
    "Tempering"): each fine table ``t_ij`` becomes

        t'_ij = rake(p_i (x) p_j * (t_ij / (p_i (x) p_j))^tau; p_i, p_j),

    the same one-column marginals, the same edges. ``tau = 1`` gives ``model`` back; a
    Gaussian copula table of correlation ``r`` becomes the one of correlation ``r'`` with
    ``r' / (1 - r'^2) = tau r / (1 - r^2)`` (module doc, "Tempering"). Public inputs
    only."""
    check_temper(tau)
    if tau == 1.0:
        return model
    i, j = np.array(model.edges).T
    product = model.p[i][:, :, None] * model.p[j][:, None, :]
    table = np.stack(model.joint)
    ratio = np.where(product > 0, table / np.where(product > 0, product, 1.0), 0.0)
    joint = rake_fine(product * ratio**tau, model.p[i], model.p[j], TEMPER_RAKE_ITERATIONS)
    return TreeModel(p=model.p, P=model.P, group=model.group, edges=model.edges, joint=tuple(joint))


@dataclass(frozen=True)
class TreePlan:
    """Everything :func:`measure` fixes before it reads a row (public values only)."""

    n: int
    d: int
    bins: int
    atoms: bool
    pair_bins: int
    rho: float
    one_way_scale: float
    selection_scale: float
    pair_scale: float
    shares: Mapping[str, float] = field(default_factory=lambda: dict(SHARES))
    grouping: str = "equal"

    @property
    def cells(self) -> int:
        return self.bins + 2 * self.atoms

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": "tree",
            "bins": self.bins,
            "bound_atoms": self.atoms,
            "pair_bins": self.pair_bins,
            "pair_grouping": self.grouping,
            "rho": self.rho,
            "shares": dict(self.shares),
            "noise": "gaussian",
            "frequency_stddev": self.one_way_scale,
            "pair_frequency_stddev": self.pair_scale,
            "selection_scale": self.selection_scale,
        }


def _check_pair_bins(b: int, pair_bins: int | None, bins: int | None, B: int, atoms: bool) -> None:
    """Refuse ``b`` pair bins over the ``B + 2 atoms`` cells of a column's histogram."""
    if b > B + 2 * atoms:
        # a request that set neither (method 'tree' on a small n or budget) is told that
        # both are defaults it may set
        chosen = "the default" if pair_bins is None else "declared"
        resolved = "from n, d, epsilon and delta" if bins is None else "declared"
        raise MechanismError(
            f"pair_bins ({b}, {chosen}) cannot exceed the {B + 2 * atoms} cells of a "
            f"column's histogram (bins {B}, {resolved}): set pair_bins to at most "
            f"{B + 2 * atoms}, or more bins"
        )


def _settled_cells(
    n: int, d: int, epsilon: float, delta: float, bins: int | None, bound_atoms: bool | None
) -> tuple[int, bool] | None:
    """``(B, atoms)`` as :func:`plan` resolves them, when they follow without an OpenDP
    call: each declared, or settled by :func:`app.mechanisms.noise.gaussian_scale_floor`
    on the histograms' noise (the default ``B`` grows as the noise shrinks, so a floor
    that puts it at ``MIN_BINS`` puts it there, and one at or above ``ATOM_NOISE_LIMIT``
    means no atoms); ``None`` when they do not (or ``bins`` is invalid: ``resolve`` says
    so)."""
    if bins is not None and (
        isinstance(bins, bool) or not isinstance(bins, int) or not 2 <= bins <= 4096
    ):
        return None
    floor = 0.0
    if bins is None or bound_atoms is None:
        sensitivity = marginals.histogram_sensitivity(n, d)["l2"]
        floor = noise.gaussian_scale_floor(sensitivity, epsilon, delta)
        if floor <= 0.0:
            return None
    if bins is None:
        largest = marginals.BIN_SCALE * d ** (1.0 / 3.0) * floor ** (-2.0 / 3.0)
        if largest >= marginals.MIN_BINS + 0.5:
            return None
        bins = marginals.MIN_BINS
    if bound_atoms is None:
        if floor < marginals.ATOM_NOISE_LIMIT:
            return None
        bound_atoms = False
    if fine_table_cells(d, bins + 2 * bound_atoms) > MAX_FINE_TABLE_CELLS:
        return None  # plan lowers default bins to fit, or refuses declared ones
    return bins, bool(bound_atoms)


def plan(
    n: int,
    d: int,
    epsilon: float,
    delta: float,
    bins: int | None = None,
    bound_atoms: bool | None = None,
    pair_bins: int | None = None,
    grouping: str | None = None,
) -> TreePlan:
    """The resolution of :func:`measure`: bins and atoms as
    :func:`app.mechanisms.marginals.resolve`, ``rho`` (:func:`rho_budget`), the three
    steps' noise scales from :data:`SHARES` and the grouping (:data:`GROUPINGS`).

    The law's fine tables must fit :data:`MAX_FINE_TABLE_CELLS` (:func:`check_fit_size`):
    default bins are lowered to fit, declared ones that do not are refused."""
    if delta <= 0.0:
        raise MechanismError("the marginal tree is accounted in zCDP and needs delta > 0")
    check_budget(epsilon, delta)
    if d < 2:
        raise MechanismError("a tree of pairs needs at least two columns")
    if d > MAX_TREE_COLUMNS:
        raise MechanismError(
            f"a tree of pairs takes at most {MAX_TREE_COLUMNS} columns ({d} here): its "
            "selection grows as d^3; choose fewer columns, or method 'marginals'"
        )
    b = DEFAULT_PAIR_BINS if pair_bins is None else pair_bins
    if isinstance(b, bool) or not isinstance(b, int) or not 2 <= b <= 16:
        raise MechanismError(f"pair_bins ({pair_bins!r}) must be an integer in [2, 16]")
    work = pair_count_work(n, d, b)
    if work > MAX_PAIR_COUNT_WORK:
        raise MechanismError(
            f"counting every pair's table of {n} rows and {d} columns "
            f"({work:.3g} pair-rows at pair_bins {b}) is more than the "
            f"tree's {MAX_PAIR_COUNT_WORK:.3g} (about 10 minutes of measuring): choose "
            "fewer columns or rows, or method 'marginals'"
        )
    if grouping is not None:
        check_grouping(grouping)
    # the histograms' cells settled by a lower bound on their noise, when it does, before
    # the OpenDP searches below (2-8 s near epsilon = 1e-12) only to find pair_bins over
    early = _settled_cells(n, d, epsilon, delta, bins, bound_atoms)
    if early is not None:
        check_fit_size(d, early[0] + 2 * early[1])
        _check_pair_bins(b, pair_bins, bins, *early)
    B, atoms = marginals.resolve(n, d, epsilon, delta, bins, bound_atoms)
    if bins is None and fine_table_cells(d, B + 2 * atoms) > MAX_FINE_TABLE_CELLS:
        B = max(marginals.MIN_BINS, math.isqrt(MAX_FINE_TABLE_CELLS // (d - 1)) - 2 * atoms)
    check_fit_size(d, B + 2 * atoms)
    _check_pair_bins(b, pair_bins, bins, B, atoms)
    rho = noise.rho_budget(epsilon, delta)
    pair_scale = noise.gaussian_scale_for_rho(
        pair_table_sensitivity(n, d - 1), rho * SHARES["pairs"]
    )
    one_way_scale = noise.gaussian_scale_for_rho(
        marginals.histogram_sensitivity(n, d)["l2"], rho * SHARES["one_way"]
    )
    if grouping is None:
        grouping = default_grouping(pair_scale, b, one_way_scale, B + 2 * atoms)
    return TreePlan(
        n=n,
        d=d,
        bins=B,
        atoms=atoms,
        pair_bins=b,
        rho=rho,
        one_way_scale=one_way_scale,
        selection_scale=noise.noisy_max_scale(
            score_sensitivity(n, b), rho * SHARES["select"] / (d - 1)
        ),
        pair_scale=pair_scale,
        grouping=grouping,
    )


@dataclass(frozen=True, eq=False)
class TreeMeasurements:
    """Step 1's histograms, step 2's tree and step 3's noisy pair tables."""

    one_way: marginals.MarginalMeasurements
    pair_bins: int
    edges: tuple[tuple[int, int], ...]
    tables: NDArray[np.float64]  # (d - 1, b, b), noisy
    rho: float
    shares: Mapping[str, float]
    pair_scale: float
    selection_scale: float
    epsilon: float
    delta: float
    grouping: str = "equal"
    one_way_threshold: float = ONE_WAY_THRESHOLD
    table_threshold: float | None = TABLE_THRESHOLD
    joint_model: str = "copula"
    temper: float = TEMPER
    one_way_shape: str = "unimodal"

    def __post_init__(self) -> None:
        check_grouping(self.grouping)
        check_temper(self.temper)
        if self.one_way_shape not in ONE_WAY_SHAPES:
            raise MechanismError(
                f"one_way_shape ({self.one_way_shape!r}) must be one of {', '.join(ONE_WAY_SHAPES)}"
            )
        if self.joint_model not in JOINT_MODELS:
            raise MechanismError(
                f"joint_model ({self.joint_model!r}) must be one of {', '.join(JOINT_MODELS)}"
            )
        d, b = self.one_way.d, self.pair_bins
        tables = np.array(self.tables, dtype=np.float64, copy=True)
        if tables.shape != (max(d - 1, 0), b, b):
            raise MechanismError(f"tables must have shape ({d - 1}, {b}, {b})")
        if len(self.edges) != d - 1:
            raise MechanismError("a tree over d columns has d - 1 edges")
        tables.setflags(write=False)
        object.__setattr__(self, "tables", tables)

    @property
    def d(self) -> int:
        return self.one_way.d

    @property
    def plan(self) -> TreePlan:
        """The :class:`TreePlan` this measurement was made with (from its records)."""
        one_way = self.one_way
        return TreePlan(
            n=one_way.n,
            d=one_way.d,
            bins=one_way.bins,
            atoms=one_way.atoms,
            pair_bins=self.pair_bins,
            rho=self.rho,
            one_way_scale=one_way.calibration.scale,
            selection_scale=self.selection_scale,
            pair_scale=self.pair_scale,
            shares=self.shares,
            grouping=self.grouping,
        )

    @property
    def parameters(self) -> dict[str, Any]:
        """The resolved, public parameters and the selected tree (a DP output)."""
        return {
            **self.plan.as_dict(),
            "edges": [list(e) for e in self.edges],
            "joint_model": self.joint_model,
            "temper": self.temper,
            "one_way_shape": self.one_way_shape,
        }

    @property
    def privacy_cost(self) -> PrivacyCost:
        """The three steps together are ``rho``-zCDP, charged as the ``(epsilon, delta)``
        that ``rho`` converts to (one part: the steps do not compose in ``(eps, delta)``)."""
        return PrivacyCost.compose([CostPart("marginal_tree", self.epsilon, self.delta)])

    def expectations(self, expansion: TensorExpansion) -> NDArray[np.float64]:
        """``(Q,)`` exact answers of separable queries under the tree law."""
        return self.model.expectations_of_cells(self._cell_values(expansion), expansion.weights)

    def stderrs(self, expansion: TensorExpansion) -> NDArray[np.float64]:
        """``(Q,)`` standard errors of :meth:`expectations` from the DP noise of steps 1
        and 3: the spread of the answers under :attr:`noise_replicates` (parametric
        bootstrap, the tree held fixed). They do not include the error of the tree law
        itself (the dependence it does not hold)."""
        return self.answers(expansion)[1]

    def answers(
        self, expansion: TensorExpansion
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(values, stderrs)``: :meth:`expectations` and :meth:`stderrs` together, the
        query's values on the cells (:meth:`_cell_values`, the same for every law)
        computed once for the released law and its replicates."""
        values = self._cell_values(expansion)
        released = self.model.expectations_of_cells(values, expansion.weights)
        replicated = [
            model.expectations_of_cells(values, expansion.weights)
            for model in self.noise_replicates
        ]
        return released, bootstrap.standard_errors(np.stack(replicated))

    def _cell_values(self, expansion: TensorExpansion) -> NDArray[np.float64]:
        """:func:`cell_values` of a query batch on this release's cells (shared by the
        released law and its bootstrap replicates)."""
        if expansion.dim != self.d:
            raise MechanismError(
                f"the query has d = {expansion.dim} columns; the data has d = {self.d}"
            )
        length = int(expansion.factors.shape[3])
        means = marginals.cell_means(self.one_way.bins, self.one_way.atoms, length)
        return cell_values(expansion, means)

    def noise_replicate_arrays(
        self, progress: Callable[[float], None] | None = None
    ) -> dict[str, NDArray[Any]]:
        """:attr:`noise_replicates` as arrays to store beside the release (computed once,
        where the release is synthesised, instead of on its first answer): each
        replicate's ``p``, ``P``, ``group`` and edge tables, stacked. ``progress`` is
        told the fraction of the refits done after each one (if they are not cached)."""
        if progress is not None and "noise_replicates" not in self.__dict__:
            self.__dict__["noise_replicates"] = self._refit_replicates(progress)
        return _model_arrays(self.noise_replicates)

    def restore_noise_replicates(self, arrays: Mapping[str, NDArray[Any]]) -> bool:
        """Take :attr:`noise_replicates` from :meth:`noise_replicate_arrays` of this
        release (shapes checked; ``False``, and nothing taken, if they do not fit)."""
        models = self._stored_models(arrays)
        if models is None or len(models) < 2:
            return False
        self.__dict__["noise_replicates"] = models  # the cached_property's own slot
        return True

    def model_arrays(self) -> dict[str, NDArray[Any]]:
        """:attr:`model` as arrays to store beside the release, in the layout of
        :meth:`noise_replicate_arrays` (one law): fitting it (:func:`copula_tree`,
        :func:`temper_tree`) takes up to ~6 s at the :func:`check_fit_size` limit, which
        the synthesis has already spent, and the first answer need not spend again."""
        return _model_arrays((self.model,))

    def restore_model(self, arrays: Mapping[str, NDArray[Any]]) -> bool:
        """Take :attr:`model` from :meth:`model_arrays` of this release (shapes checked;
        ``False``, and nothing taken, if they do not fit). The law is a deterministic
        function of the measurements and the release's recorded parameters, so the stored
        one is the one :attr:`model` would fit with the code that synthesised the
        release (its support and sample were drawn from it)."""
        models = self._stored_models(arrays)
        if models is None or len(models) != 1:
            return False
        if self.joint_model != "copula" and not np.array_equal(models[0].group, self.group):
            return False  # the block law's groups are the release's own
        self.__dict__["model"] = models[0]  # the cached_property's own slot
        return True

    def _stored_models(self, arrays: Mapping[str, NDArray[Any]]) -> tuple[TreeModel, ...] | None:
        """The tree laws of :func:`_model_arrays` over this release's edges, or ``None``
        when the arrays are missing or do not fit this release: ``d`` columns of ``cells``
        cells, finite non-negative values, and the layout of its :attr:`joint_model` (the
        copula law over the fine cells, each its own group; the block law over
        ``pair_bins`` groups)."""
        try:
            p, P, joint = (np.asarray(arrays[k], dtype=np.float64) for k in ("p", "P", "joint"))
            group = np.asarray(arrays["group"], dtype=np.int64)
        except (KeyError, ValueError, TypeError):
            return None
        d, cells = self.d, self.one_way.cells
        width = cells if self.joint_model == "copula" else self.pair_bins
        count = p.shape[0] if p.ndim == 3 else 0
        fits = (
            count >= 1
            and p.shape == group.shape == (count, d, cells)
            and P.shape == (count, d, width)
            and joint.shape == (count, d - 1, width, width)
            and all(bool(np.all(np.isfinite(a) & (a >= 0))) for a in (p, P, joint))
            and bool(np.all((group >= 0) & (group < width)))
            and (self.joint_model != "copula" or bool(np.all(group == np.arange(cells))))
        )
        if not fits:
            return None
        try:
            return tuple(
                TreeModel(p=p[r], P=P[r], group=group[r], edges=self.edges, joint=tuple(joint[r]))
                for r in range(count)
            )
        except (MechanismError, ValueError, FloatingPointError):
            return None

    @functools.cached_property
    def noise_replicates(self) -> tuple[TreeModel, ...]:
        """``B =`` :data:`app.mechanisms.bootstrap.REPLICATES` tree laws refitted from
        measurements simulated under the released law (:func:`simulated_measurements`),
        seeded by the released values (:func:`app.mechanisms.bootstrap.seed_of`).
        Post-processing only."""
        return self._refit_replicates(None)

    def _refit_replicates(self, progress: Callable[[float], None] | None) -> tuple[TreeModel, ...]:
        """:attr:`noise_replicates`, calling ``progress(k / B)`` after the ``k``-th refit
        (each a copula fit and raking: the longest part of a tree synthesis)."""
        rng = np.random.default_rng(bootstrap.seed_of(self.one_way.frequencies, self.tables))
        models = []
        for k in range(bootstrap.REPLICATES):
            models.append(simulated_measurements(self, rng).model)
            if progress is not None:
                progress((k + 1) / bootstrap.REPLICATES)
        return tuple(models)

    @functools.cached_property
    def group(self) -> NDArray[np.int64]:
        """``(d, cells)``: every fine cell's coarse group (:func:`column_groups`)."""
        return column_groups(self.one_way.marginals(), self.pair_bins, self.grouping)

    @functools.cached_property
    def model(self) -> TreeModel:
        """The post-processed tree law (module doc, "Post-processing"): the
        :attr:`coarse_model` itself under ``"blocks"``; under ``"copula"``, a Markov tree
        over the fine cells with the same one-column marginals, each edge's fine table
        from :func:`fit_copula_table` (with coarse sums equal to the coarse model's), then
        tempered by :attr:`temper` (:func:`temper_tree`; module doc, "Tempering")."""
        if self.joint_model == "blocks":
            return self.coarse_model
        return temper_tree(copula_tree(self.coarse_model), self.temper)

    @functools.cached_property
    def coarse_model(self) -> TreeModel:
        """The tree law over the coarse groups (independent inside a pair of groups): fine
        marginals rescaled to the coarse ones, each pair table denoised and raked (module
        doc, "Post-processing")."""
        g = self.group
        P = self.coarse_marginals()
        p = self.one_way.marginals(self.one_way_threshold)
        if self.one_way_shape == "unimodal" and self.one_way.atoms:
            p = shaped_marginals(p, self.one_way.calibration.stddev)
        for k in range(self.pair_bins):
            inside = g == k
            size = inside.sum(axis=1, keepdims=True)
            mass = np.where(inside, p, 0.0).sum(axis=1, keepdims=True)
            spread = 1.0 / np.maximum(size, 1)
            share = np.where(mass > 0, p / np.where(mass > 0, mass, 1.0), spread)
            p = np.where(inside, share * P[:, k : k + 1], p)
        joint = []
        for (i, j), noisy in zip(self.edges, self.tables, strict=True):
            table = marginals.denoise(noisy, self.pair_scale, self.table_threshold)
            joint.append(rake(table, P[i], P[j]))
        return TreeModel(p=p, P=P, group=g, edges=self.edges, joint=tuple(joint))

    def coarse_marginals(self) -> NDArray[np.float64]:
        """``(d, b)``: each column's coarse marginal, the inverse-variance weighted mean of
        step 1's group sums and the selected tables' row or column sums, projected onto
        the simplex (module doc, "Post-processing")."""
        g = self.group
        b = self.pair_bins
        sizes = np.stack([(g == k).sum(axis=1) for k in range(b)], axis=1).astype(np.float64)
        one_way_var = sizes * self.one_way.calibration.stddev**2  # (d, b)
        pair_var = b * self.pair_scale**2
        total = group_sums(self.one_way.frequencies, g, b) / one_way_var
        weight = 1.0 / one_way_var
        for (i, j), table in zip(self.edges, self.tables, strict=True):
            total[i] += table.sum(axis=1) / pair_var
            total[j] += table.sum(axis=0) / pair_var
            weight[i] += 1.0 / pair_var
            weight[j] += 1.0 / pair_var
        return np.stack([marginals.project_to_simplex(row) for row in total / weight])

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "one_way": self.one_way.to_dict(),
            "pair_bins": self.pair_bins,
            "edges": [list(e) for e in self.edges],
            "tables": self.tables.tolist(),
            "rho": self.rho,
            "shares": dict(self.shares),
            "pair_scale": self.pair_scale,
            "selection_scale": self.selection_scale,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "grouping": self.grouping,
            "one_way_threshold": self.one_way_threshold,
            "table_threshold": self.table_threshold,
            "joint_model": self.joint_model,
            "temper": self.temper,
            "one_way_shape": self.one_way_shape,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TreeMeasurements:
        if data.get("format") not in FORMATS:
            raise MechanismError(f"not a marginal-tree record (format {FORMAT!r})")
        one_way_threshold, table_threshold = LEGACY_THRESHOLDS
        version = FORMATS.index(data["format"]) + 1
        if version >= 3:
            one_way_threshold = float(data["one_way_threshold"])
            table = data["table_threshold"]
            table_threshold = None if table is None else float(table)
        joint_model = str(data["joint_model"]) if version >= 4 else "blocks"
        temper = float(data["temper"]) if version >= 5 else 1.0
        one_way_shape = str(data["one_way_shape"]) if version >= 6 else "free"
        return cls(
            one_way=marginals.MarginalMeasurements.from_dict(data["one_way"]),
            pair_bins=int(data["pair_bins"]),
            edges=tuple((int(a), int(b)) for a, b in data["edges"]),
            tables=np.asarray(data["tables"], dtype=np.float64),
            rho=float(data["rho"]),
            shares={str(k): float(v) for k, v in data["shares"].items()},
            pair_scale=float(data["pair_scale"]),
            selection_scale=float(data["selection_scale"]),
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
            grouping=str(data.get("grouping", "equal")),  # version 1: equal groups
            one_way_threshold=one_way_threshold,
            table_threshold=table_threshold,
            joint_model=joint_model,
            temper=temper,
            one_way_shape=one_way_shape,
        )


def _model_arrays(models: Sequence[TreeModel]) -> dict[str, NDArray[Any]]:
    """Tree laws over the same edges as stacked arrays (``p``, ``P``, ``group`` and the
    edge tables ``joint``, each with a leading axis over ``models``)."""
    return {
        "p": np.stack([m.p for m in models]),
        "P": np.stack([m.P for m in models]),
        "group": np.stack([m.group for m in models]),
        "joint": np.stack([np.stack(m.joint) for m in models]),
    }


def shaped_marginals(p: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
    """Each row of ``p`` (a column's denoised fine marginal: lower atom, bins, upper atom)
    with its bins projected onto the unimodal vectors (:func:`marginals.unimodal_projection`;
    the atoms as they are; module doc, "Unimodal one-way marginals"), unless that moves the
    bins by more than the noise explains:

        ||fit - p_bins||^2 / scale^2 > chi2_k^{-1}(SHAPE_TEST_LEVEL),

    ``scale`` the noise standard deviation of a cell and ``k`` the degrees of freedom the
    projection took: ``m - 1`` for each run of ``m`` cells it pooled into their mean, summed
    (:func:`pooled_degrees`). Such a column (a mode the noise cannot hide, e.g. a spike of
    five standard deviations two empty cells away) keeps ``p``. The projection keeps each
    row's sum and non-negativity. Post-processing of released values with public
    constants."""
    out = np.array(p, dtype=np.float64, copy=True)
    if out.shape[1] < 3:
        return out
    for row in out:
        fit, distance = marginals.unimodal_projection(row[1:-1])
        k = pooled_degrees(row[1:-1], fit)
        if k == 0 or distance <= float(chdtri(k, 1.0 - SHAPE_TEST_LEVEL)) * scale**2:
            row[1:-1] = fit
    return out


def pooled_degrees(values: NDArray[np.float64], fit: NDArray[np.float64]) -> int:
    """``sum (m - 1)`` over the runs of equal ``fit`` values (``m`` cells each) that hold a
    cell the fit moved: the dimensions a least-squares fit by pooled means took from
    ``values`` (:func:`shaped_marginals`)."""
    k = 0
    start = 0
    for stop in range(1, fit.size + 1):
        if stop == fit.size or fit[stop] != fit[start]:
            if np.any(fit[start:stop] != values[start:stop]):
                k += stop - start - 1
            start = stop
    return k


def fine_joint(model: TreeModel, edge: int) -> NDArray[np.float64]:
    """``(cells, cells)``: the law's joint table of edge ``edge``'s two columns over their
    fine cells: the edge's own table under ``"copula"``; under ``"blocks"`` each coarse
    cell's mass spread over its fine cells in proportion to ``p_i p_j`` (the module doc's
    tree model)."""
    joint = model.joint[edge]
    cells = model.p.shape[1]
    if joint.shape == (cells, cells):
        return joint
    i, j = model.edges[edge]
    within = model.within
    table: NDArray[np.float64] = (
        within[i][:, None] * joint[np.ix_(model.group[i], model.group[j])] * within[j][None, :]
    )
    return table


def simulated_measurements(
    measurements: TreeMeasurements, rng: np.random.Generator
) -> TreeMeasurements:
    """One bootstrap replicate (:mod:`~app.mechanisms.bootstrap`): the measurements the
    released law ``M`` (:attr:`TreeMeasurements.model`) would give, each with a draw of
    its own public noise law: step 1's fine histograms ``p_M + z_1``; the coarse groups
    recomputed from them as :func:`measure` does; step 3's tables, each edge's fine joint
    table under ``M`` (:func:`fine_joint`) summed over those groups, ``+ z_2``. The tree
    (step 2) is kept: its variability is not in the replicates. Refitting the result by
    the record's own post-processing (thresholds, joint model, tempering) is the
    replicate law."""
    model = measurements.model
    one_way = measurements.one_way
    law = one_way.calibration
    b = measurements.pair_bins
    frequencies = model.p + bootstrap.simulated_noise(
        law.distribution, law.scale, model.p.shape, rng
    )
    simulated = replace(one_way, frequencies=frequencies)
    group = column_groups(simulated.marginals(), b, measurements.grouping)
    indicator = np.eye(b)[group]  # (d, cells, b)
    tables = np.stack(
        [
            indicator[i].T @ fine_joint(model, e) @ indicator[j]
            for e, (i, j) in enumerate(measurements.edges)
        ]
    )
    tables += bootstrap.simulated_noise("gaussian", measurements.pair_scale, tables.shape, rng)
    return replace(measurements, one_way=simulated, tables=tables)


def cell_values(expansion: TensorExpansion, cell_means: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(d, Q J, cells)``: ``sum_k a_{qjik} cell_means[c, k]``, kernel ``(q, j)``'s factor
    on column ``i`` averaged over fine cell ``c`` (uniform in a bin, the bound itself for
    an atom). It depends on the cells, not on the law, so the replicate laws of
    :meth:`TreeMeasurements.stderrs` share it."""
    Q, J, d, L = expansion.factors.shape
    means = cell_means[:, :L].T  # (L, cells)
    out = np.empty((d, Q * J, means.shape[1]))
    for i in range(d):  # column by column: no second copy of the whole expansion
        out[i] = expansion.factors[:, :, i, :].reshape(Q * J, L) @ means
    return out


@dataclass(frozen=True, eq=False)
class TreeModel:
    """The Markov-tree law: fine marginals ``p`` (d, cells), coarse ``P`` (d, b), the
    group of each cell of each column ``group`` (d, cells), and per edge the raked joint
    table ``joint[e][g_i, g_j]``."""

    p: NDArray[np.float64]
    P: NDArray[np.float64]
    group: NDArray[np.int64]
    edges: tuple[tuple[int, int], ...]
    joint: tuple[NDArray[np.float64], ...]
    order: tuple[int, ...] = field(init=False)
    parent: tuple[int, ...] = field(init=False)
    tables: tuple[NDArray[np.float64], ...] = field(init=False)  # T(g_node | g_parent)

    def __post_init__(self) -> None:
        d = self.p.shape[0]
        neighbours: dict[int, list[tuple[int, int]]] = {i: [] for i in range(d)}
        for e, (i, j) in enumerate(self.edges):
            neighbours[i].append((j, e))
            neighbours[j].append((i, e))
        order, parent = [0], [-1] * d
        conditional: list[NDArray[np.float64]] = [np.zeros((0, 0))] * d
        seen = {0}
        for node in order:  # breadth first from column 0
            for other, e in neighbours[node]:
                if other in seen:
                    continue
                seen.add(other)
                order.append(other)
                parent[other] = node
                i, _ = self.edges[e]
                joint = self.joint[e] if i == node else self.joint[e].T  # [g_parent, g_other]
                rows = joint.sum(axis=1, keepdims=True)
                conditional[other] = np.where(rows > 0, joint / np.where(rows > 0, rows, 1), 0)
        if len(order) != d:
            raise MechanismError("the edges do not form a spanning tree")
        object.__setattr__(self, "order", tuple(order))
        object.__setattr__(self, "parent", tuple(parent))
        object.__setattr__(self, "tables", tuple(conditional))

    def expectations(
        self, expansion: TensorExpansion, cell_means: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """``(Q,)`` exact expectations of separable queries under the tree law (module
        doc); ``cell_means[c, k]`` is ``E T_k`` under cell ``c``'s law."""
        return self.expectations_of_cells(cell_values(expansion, cell_means), expansion.weights)

    def expectations_of_cells(
        self, values: NDArray[np.float64], weights: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """``(Q,)`` expectations from :func:`cell_values` (``(d, Q J, cells)``: each
        kernel's factor averaged over each fine cell, the same for every law on these
        cells) and the kernels' ``weights`` (``(Q, J)``), by belief propagation from the
        leaves (module doc, "Answers")."""
        b = self.P.shape[1]
        cells = self.p.shape[1]
        fine = b == cells and bool(np.all(self.group == np.arange(cells)))
        messages: dict[int, NDArray[np.float64]] = {}
        root = np.zeros(values.shape[1])
        for node in self.order[::-1]:
            P = self.P[node]
            # local[q j, g] = E[g_qji(x_i) | group g] times the children's messages
            if fine:  # each cell its own group (the copula law): the cell's own value
                local = values[node] * (P > 0)
            else:  # the cells' values weighted by their share of their group
                local = values[node] @ (np.eye(b)[self.group[node]] * self.within[node][:, None])
            if node in messages:
                local *= messages.pop(node)
            parent = self.parent[node]
            if parent < 0:
                root = local @ P
            elif parent in messages:
                messages[parent] *= local @ self.tables[node].T
            else:
                messages[parent] = local @ self.tables[node].T
        out: NDArray[np.float64] = np.einsum("qj,qj->q", weights, root.reshape(weights.shape))
        return out

    @functools.cached_property
    def within(self) -> NDArray[np.float64]:
        """``(d, cells)``: each fine cell's share of its coarse group, ``p_i(c) /
        P_i(g_i(c))`` (0 in a group without mass): the law of a column inside a group."""
        coarse = np.take_along_axis(self.P, self.group, axis=1)
        out: NDArray[np.float64] = np.where(coarse > 0, self.p / np.where(coarse > 0, coarse, 1), 0)
        return out

    def sample(self, C: int, rng: np.random.Generator, bins: int, atoms: bool) -> Any:
        """``C`` points drawn from the tree law (ancestral sampling; positions uniform in
        a bin, the bound itself in an atom)."""
        d = self.p.shape[0]
        codes = np.zeros((C, d), dtype=np.int64)
        coarse = np.zeros((C, d), dtype=np.int64)
        for node in self.order:
            parent = self.parent[node]
            if parent < 0:
                coarse[:, node] = _draw(np.broadcast_to(self.P[node], (C, self.P.shape[1])), rng)
            else:
                coarse[:, node] = _draw(self.tables[node][coarse[:, parent]], rng)
            inside = self.group[node][None, :] == coarse[:, node, None]
            within = np.where(inside, self.p[node], 0.0)
            codes[:, node] = _draw(within, rng)
        first = 1 if atoms else 0
        width = 2.0 / bins
        position = -1.0 + (codes - first + rng.uniform(size=codes.shape)) * width
        if atoms:
            position = np.where(codes == 0, -1.0, position)
            position = np.where(codes == bins + 1, 1.0, position)
        return np.clip(position, -1.0, 1.0)


def _draw(probabilities: NDArray[np.float64], rng: np.random.Generator) -> NDArray[np.int64]:
    """One index per row of ``probabilities`` (rows normalised; an all-zero row gives 0)."""
    cumulative = np.cumsum(probabilities, axis=1)
    total = cumulative[:, -1:]
    u = rng.uniform(size=(probabilities.shape[0], 1)) * np.where(total > 0, total, 1.0)
    out: NDArray[np.int64] = np.minimum(
        (cumulative <= u).sum(axis=1), probabilities.shape[1] - 1
    ).astype(np.int64)
    return out


def _batch_coarse_codes(
    batch: NDArray[np.float64], bins: int, atoms: bool, group: NDArray[np.int64]
) -> Any:
    """``(b, d)`` coarse group of every value of one batch, one byte each."""
    g = np.asarray(group, dtype=np.uint8)
    return g[np.arange(g.shape[0]), marginals.cell_codes(batch, bins, atoms)]


def coarse_codes(source: RowSource, bins: int, atoms: bool, group: NDArray[np.int64]) -> Any:
    """``(n, d)`` coarse group of every value (``group``: ``(d, cells)``), one byte each
    (never released without noise). :func:`measure` streams :func:`all_pair_counts`
    instead, which never holds these ``n d`` bytes."""
    return np.concatenate(
        [_batch_coarse_codes(batch, bins, atoms, group) for batch in iter_checked(source)]
    )


def all_pairs(d: int) -> list[tuple[int, int]]:
    """Every pair ``(i, j)``, ``i < j``, in the order of :func:`pair_scores`."""
    return [(i, j) for i in range(d) for j in range(i + 1, d)]


def all_pair_counts(
    source: RowSource,
    bins: int,
    atoms: bool,
    group: NDArray[np.int64],
    pair_bins: int,
    progress: Callable[[float], None] | None = None,
) -> tuple[int, NDArray[np.int64]]:
    """``(n, counts)``: the exact coarse two-way count tables of every pair of
    :func:`all_pairs` (``counts[k]``, ``(pair_bins, pair_bins)`` integers), streamed over
    row batches: the :func:`pair_counts` of :func:`coarse_codes`, integer for integer,
    with the codes of one batch in memory at a time (never released without noise).
    Counted as one-hot Gram matrices of row chunks (below), not pair by pair.
    ``progress`` is called after every chunk with the rows counted over
    ``source.n_rows`` (public), at most 1."""
    d = source.n_cols
    width = d * pair_bins
    grouped = np.asarray(group)
    if grouped.size and (int(grouped.min()) < 0 or int(grouped.max()) >= pair_bins):
        # Public (the groups, not the rows): a table would not fit its block.
        raise MechanismError("every coarse group must be in 0 .. pair_bins - 1")
    # Every pair's table at once: the one-hot matrix ``H`` of a chunk of rows (row r has a
    # 1 in column ``i * pair_bins + codes[r, i]`` for every column ``i``) gives
    # ``(H^T H)[i b + g, j b + h] = #{r : codes[r, i] = g, codes[r, j] = h}``: one BLAS
    # product per chunk instead of one bincount per pair (30x faster at d = 191, b = 4).
    # Exact: every entry and every partial sum of a chunk's product is an integer
    # <= chunk rows <= PAIR_COUNT_MAX_ROWS < 2^24, which float32 holds exactly whatever the
    # order of the additions; the pair blocks are added to the int64 counts chunk by
    # chunk. The product is taken a band of columns at a time (the band against itself
    # and every later column), so at most PAIR_COUNT_CHUNK_BYTES of it is held at once.
    chunk = max(1, min(PAIR_COUNT_MAX_ROWS, PAIR_COUNT_CHUNK_BYTES // (4 * width)))
    band = max(1, PAIR_COUNT_CHUNK_BYTES // (4 * width * pair_bins))
    assert chunk < 2**24, "float32 counts a chunk of fewer than 2^24 rows exactly"
    pairs = all_pairs(d)
    counts = np.zeros((len(pairs), pair_bins, pair_bins), dtype=np.int64)
    first = np.cumsum([0] + [d - 1 - i for i in range(d)])  # pairs (i, .) from first[i]
    index = np.array(pairs, dtype=np.intp).reshape(-1, 2)
    ii, jj = index[:, 0], index[:, 1]
    bands = [(a, min(d, a + band)) for a in range(0, d - 1, band)]
    offsets = np.arange(d, dtype=np.intp) * pair_bins
    n = 0
    for batch in iter_checked(source):
        codes = _batch_coarse_codes(batch, bins, atoms, group)
        n += codes.shape[0]
        for start in range(0, codes.shape[0], chunk):
            part = codes[start : start + chunk]
            onehot = np.zeros((part.shape[0], width), dtype=np.float32)
            onehot[np.arange(part.shape[0])[:, None], offsets + part] = 1.0
            for a, z in bands:
                k0, k1 = first[a], first[z]
                if (a, z) == (0, d):  # every column against every column
                    product = onehot.T @ onehot  # symmetric: one BLAS syrk
                else:
                    product = (
                        onehot[:, a * pair_bins : z * pair_bins].T @ onehot[:, a * pair_bins :]
                    )
                block = product.reshape(z - a, pair_bins, d - a, pair_bins)
                counts[k0:k1] += block[ii[k0:k1] - a, :, jj[k0:k1] - a, :].astype(np.int64)
            if progress is not None:
                counted = n - codes.shape[0] + start + part.shape[0]
                progress(min(1.0, counted / max(source.n_rows, 1)))
    return n, counts


#: Most rows in one one-hot product of :func:`all_pair_counts`: below 2^24, so its float32
#: counts are exact.
PAIR_COUNT_MAX_ROWS = 8192
#: Bytes of the one-hot chunk of :func:`all_pair_counts`, and of the band of its product
#: held at once (fewer rows, and bands, when ``d pair_bins`` is large).
PAIR_COUNT_CHUNK_BYTES = 16 * 2**20


def pair_counts(codes: NDArray[np.int64], i: int, j: int, pair_bins: int) -> Any:
    """Exact coarse two-way count table of columns ``i``, ``j`` (integers)."""
    flat = codes[:, i].astype(np.int64) * pair_bins + codes[:, j]
    return np.bincount(flat, minlength=pair_bins * pair_bins).reshape(pair_bins, pair_bins)


def pair_table(codes: NDArray[np.int64], i: int, j: int, pair_bins: int) -> Any:
    """Exact coarse two-way frequency table of columns ``i``, ``j``."""
    return pair_counts(codes, i, j, pair_bins) / codes.shape[0]


def pair_scores(
    codes: NDArray[np.int64], P: NDArray[np.float64]
) -> tuple[list[tuple[int, int]], NDArray[np.float64]]:
    """Every pair ``(i, j)``, ``i < j``, and its score ``n ||T_ij - P_i (x) P_j||_1``
    (module doc, step 2; ``codes`` from :func:`coarse_codes`, ``P`` the coarse marginals),
    computed as ``sum |C_ij - n P_i (x) P_j|`` from the integer counts ``C_ij`` (the
    rounding :func:`score_sensitivity` bounds)."""
    n, d = codes.shape
    b = P.shape[1]
    pairs = all_pairs(d)
    counts = np.stack([pair_counts(codes, i, j, b) for i, j in pairs])
    return pairs, scores_of_counts(n, counts, P)


def scores_of_counts(n: int, counts: NDArray[np.int64], P: NDArray[np.float64]) -> Any:
    """The scores of :func:`pair_scores` from the count tables of :func:`all_pair_counts`
    (the same floating-point operations on the same integers)."""
    pairs = all_pairs(P.shape[0])
    return np.array(
        [np.abs(counts[k] - n * np.outer(P[i], P[j])).sum() for k, (i, j) in enumerate(pairs)]
    )


def score_sensitivity(n: int, pair_bins: int) -> float:
    """L-infinity sensitivity of the selection scores *as computed in floating point*:
    :data:`SCORE_SENSITIVITY` (2, exact arithmetic; module doc, step 2) plus a bound on the
    rounding, ``(b^2 + 1) n 2^-50``.

    Each of the ``K = b^2`` terms ``|C - Q|`` (``Q = n P_i(g) P_j(h)``, the same float for
    both neighbours) is computed with relative error ``<= u = 2^-53`` and their sum adds
    at most ``(K - 1) u`` times the sum of the terms, which is ``<= 2 n (1 + K u)``; so a
    computed score is within ``~2 K u n`` of the exact one and two neighbours' computed
    scores differ by at most ``2 + 4 K u n < 2 + (K + 1) n 2^-50``. The noisy max is
    calibrated to this (about ``2 + 1e-10`` at ``n = 6000``, ``b = 4``), so its guarantee
    does not rest on exact real arithmetic."""
    return SCORE_SENSITIVITY + (pair_bins * pair_bins + 1) * n * 2.0**-50


def spanning_tree(
    pairs: list[tuple[int, int]],
    scores: NDArray[np.float64],
    d: int,
    pick: Callable[[NDArray[np.float64]], int],
    progress: Callable[[float], None] | None = None,
) -> list[tuple[int, int]]:
    """``d - 1`` edges, each ``pick``ed among the pairs that join two components of the
    forest so far (``pick`` gets their scores, in the order of ``pairs``, and returns a
    position among them: a noisy max for the release, ``argmax`` for the exact
    Chow-Liu-like tree). The components are labels, relabelled on each merge, so a round
    costs a few array operations over the pairs, not a Python loop. ``progress`` is
    called with ``k / (d - 1)`` after the ``k``-th round."""
    first, second = np.array(pairs, dtype=np.int64).reshape(-1, 2).T
    values = np.asarray(scores, dtype=np.float64)
    component = np.arange(d)
    edges: list[tuple[int, int]] = []
    for done in range(1, d):
        open_pairs = np.flatnonzero(component[first] != component[second])
        chosen = int(open_pairs[pick(values[open_pairs])])
        i, j = pairs[chosen]
        component[component == component[i]] = component[j]
        edges.append((i, j))
        if progress is not None:
            progress(done / (d - 1))
    return edges


#: :func:`measure`'s progress once the pair tables are counted (its second read of the
#: rows: most of the work after the first at ``n = 10^5``, ``d = 191``) and once the
#: ``d - 1`` selection rounds are done (most of it at ``n = 1000``, ``d`` in the
#: hundreds: ``~d^3 / 3`` Gumbel draws, :data:`MAX_TREE_COLUMNS`).
PROGRESS_COUNTED = 0.5
PROGRESS_SELECTED = 0.95


def measure(
    X: ArrayLike | RowSource,
    epsilon: float,
    delta: float,
    bins: int | None = None,
    bound_atoms: bool | None = None,
    pair_bins: int | None = None,
    grouping: str | None = None,
    progress: Callable[[float], None] | None = None,
) -> TreeMeasurements:
    """The three steps of the module doc, spending ``(epsilon, delta)`` once
    (:func:`plan` fixes every scale before a row is read).

    ``progress`` is called with the fraction done of the work after the first read of
    the rows (step 1's histograms): the second read, which counts the pair tables (up to
    :data:`PROGRESS_COUNTED`), then the selection, round by round (up to
    :data:`PROGRESS_SELECTED`), then step 3 (1.0). Its fractions are of public counts
    (rows of ``n``, rounds of ``d - 1``), and it draws nothing: the noise is the same
    with it or without."""
    check_budget(epsilon, delta)
    source = as_source(X)
    n, d = source.n_rows, source.n_cols
    fixed = plan(n, d, epsilon, delta, bins, bound_atoms, pair_bins, grouping)
    B, atoms, b, cells = fixed.bins, fixed.atoms, fixed.pair_bins, fixed.cells
    # the records of steps 1 and 3, from public values before the first read (the plan
    # fixed the scales; a record that failed would fail with nothing read)
    sens_1 = marginals.histogram_sensitivity(n, d)["l2"]
    law_1 = noise.gaussian_at_scale(sens_1, d * cells, fixed.one_way_scale, epsilon, delta)
    sens_2 = pair_table_sensitivity(n, d - 1)
    law_2 = noise.gaussian_at_scale(sens_2, (d - 1) * b * b, fixed.pair_scale, epsilon, delta)
    # 1. one-way histograms
    h = marginals.exact_histograms(source, B, atoms).ravel()
    one_way = marginals.MarginalMeasurements(
        n=n,
        d=d,
        epsilon=float(epsilon),
        delta=float(delta),
        bins=B,
        atoms=atoms,
        frequencies=noise.sample(law_1, h).reshape(d, cells),
        calibration=law_1,
    )
    group = column_groups(one_way.marginals(), b, fixed.grouping)  # post-processing of step 1
    P = group_sums(one_way.marginals(), group, b)
    # 2. selection, d - 1 noisy-max rounds over the pairs that join two components (every
    # pair's exact table counted in one streamed pass: pair_scores and pair_table of the
    # coarse codes, without the n d bytes of codes in memory)
    rows, counts = all_pair_counts(
        source, B, atoms, group, b, progress_part(progress, 0.0, PROGRESS_COUNTED)
    )
    pairs = all_pairs(d)
    scores = scores_of_counts(rows, counts, P)
    edges = spanning_tree(
        pairs,
        scores,
        d,
        lambda open_scores: noise.noisy_max(open_scores, fixed.selection_scale),
        progress_part(progress, PROGRESS_COUNTED, PROGRESS_SELECTED),
    )
    # 3. the selected pair tables
    position = {pair: k for k, pair in enumerate(pairs)}
    exact = np.stack([counts[position[edge]] / rows for edge in edges]).ravel()
    tables = noise.sample(law_2, exact).reshape(d - 1, b, b)
    if progress is not None:
        progress(1.0)
    return TreeMeasurements(
        one_way=one_way,
        pair_bins=b,
        edges=tuple(edges),
        tables=tables,
        rho=fixed.rho,
        shares=dict(SHARES),
        pair_scale=fixed.pair_scale,
        selection_scale=fixed.selection_scale,
        epsilon=float(epsilon),
        delta=float(delta),
        grouping=fixed.grouping,
    )


def support(
    measurements: TreeMeasurements, rng: np.random.Generator, grid_size: int | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``C`` support points drawn from the tree law, weights ``1 / C`` (post-processing;
    ``grid_size=None``: :data:`app.mechanisms.marginals.DEFAULT_SUPPORT_SIZE`)."""
    C = marginals.DEFAULT_SUPPORT_SIZE if grid_size is None else grid_size
    if isinstance(C, bool) or not isinstance(C, int | np.integer) or C < 1:
        raise MechanismError(f"grid_size ({grid_size!r}) must be a positive integer")
    one_way = measurements.one_way
    points = measurements.model.sample(int(C), rng, one_way.bins, one_way.atoms)
    return points, np.full(int(C), 1.0 / C)
