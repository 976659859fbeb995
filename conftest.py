"""pytest settings for the whole repository, chapters included.

Progress bars off: nbval's kernels inherit this environment, and a progress bar's output would
differ from the committed one on every run.
"""

import os

os.environ.setdefault("PAPERNOTES_QUIET", "1")
