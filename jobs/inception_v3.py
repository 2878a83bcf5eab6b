"""`ray job submit --working-dir . -- python jobs/inception_v3.py [--preset tiny|paper] ...`:
jobs/train.py with the model fixed to inception_v3 (see orchestrator/pipeline.py)."""

import sys
from pathlib import Path

# Under `ray job submit --working-dir .` the project is the working directory, not an
# installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.pipeline import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("inception_v3", sys.argv[1:], prog="jobs/inception_v3.py"))
