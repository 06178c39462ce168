"""ZipLine runtime table (ElasticBSP's barrier choice): workers n = 10/100/1000 × R = 15/150.

    bppsa run experiments/paper_sync/configs/zipline.py --publish   # ~1-2 min on 2 loaded CPU cores
    bppsa run experiments/paper_sync/configs/zipline.py:smoke       # ~2 s; :quick is the same
    bppsa reproduce zipline [--quick]                    # = bppsa run experiments/paper_sync/configs/zipline.py[:quick]

Exact methods: the count-window ZipLine (default of ``bppsa.sync.zipline``), the paper's ZipLine
(O(R·n²)), ZipLineOpt, the binary-search variant; heuristics GridScan and FullGridScan (skipped
where O((n·R)²) is too slow). The paper reports 2.38 s for 1000 × 150.
Results: experiments/results/<device>/zipline_runtimes.{json,md,png} (with --publish).
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"zipline.py takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_sync.zipline:zipline_runtimes"
    c.name = "zipline_runtimes"
    c.workers = (10, 100, 1000)
    c.horizons = (15, 150)
    c.methods = ("window", "zipline", "zipline_opt", "bsearch", "grid_scan", "full_grid_scan")
    c.max_points = {"full_grid_scan": 20000}  # n·R above which a method is skipped
    c.repeats = 5
    c.seed = 0
    if arg in ("quick", "smoke"):
        c.name = "zipline_runtimes_smoke"
        c.workers = (10, 50)
        c.horizons = (15,)
        c.repeats = 2
    return c
