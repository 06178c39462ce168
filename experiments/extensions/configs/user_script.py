"""What a library user gets: backward="auto" against tuned BPTT, lax.scan(unroll=16) and BPPSA
(blelloch and sequential scan) in a plain script's training loop (RNN(1, 20); T = 10 000, B = 1 and
T = 1000, B in {2, 16}), the script experiments/scripts/user_script.py run in a subprocess.

    bppsa run experiments/extensions/configs/user_script.py          # 10 steps a sample, 5 rounds; ~2 min on 2 cores (~30 s quiet)
    bppsa run experiments/extensions/configs/user_script.py:smoke    # T = 20, B = 1, 1 step, 1 round; seconds

The script's process holds only `import bppsa` and the public API (the state a user's script is
in); the task passes it the flags below and its output path in the work directory, and reads back
the JSON it wrote. Writes user-script.{json,md} into the work directory (--publish: into
experiments/results/<device>/). Task: experiments.extensions.user_script:run.
"""

import ml_collections

PRESETS = ("smoke",)  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"user_script takes no argument or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.extensions.user_script:run"
    c.name = "user-script"
    c.shapes = ((10_000, 1), (1000, 2), (1000, 16))  # (T, B): the script's --shapes
    c.steps = 10  # training steps per timed sample (--steps)
    c.repeats = 5  # timed rounds (--repeats)
    c.note = ""  # a line written under the table, e.g. how loaded the machine was (--note)
    if arg == "smoke":
        c.shapes = ((20, 1),)
        c.steps = 1
        c.repeats = 1
    return c
